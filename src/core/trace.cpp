// The range profile: a stack of open ranges timed with a steady clock after synchronising the profiled device.
#include "core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>

#include "core/backend.h"

namespace mt::core {

namespace {

struct Profile {
    bool enabled = false;
    Device device = Device::cpu;
    std::vector<std::pair<const char*, std::chrono::steady_clock::time_point>> open;
    std::map<std::string, ProfileEntry> totals;
};

Profile& profile() {
    static Profile p;  // one training loop per process; ranges are opened on the main thread only
    return p;
}

}  // namespace

void profile_enable(Device device) {
    Profile& p = profile();
    p.enabled = true;
    p.device = device;
    p.open.clear();
    p.totals.clear();
}

void profile_disable() {
    profile().enabled = false;
}

bool profile_enabled() {
    return profile().enabled;
}

std::vector<ProfileEntry> profile_take() {
    Profile& p = profile();
    std::vector<ProfileEntry> out;
    for (auto& [name, entry] : p.totals) out.push_back(entry);
    std::sort(out.begin(), out.end(), [](const ProfileEntry& a, const ProfileEntry& b) { return a.ms > b.ms; });
    p.totals.clear();
    return out;
}

void profile_begin(const char* name) {
    Profile& p = profile();
    if (!p.enabled) return;
    backend_get(p.device).synchronize();
    p.open.emplace_back(name, std::chrono::steady_clock::now());
}

void profile_end() {
    Profile& p = profile();
    if (!p.enabled || p.open.empty()) return;
    backend_get(p.device).synchronize();
    const auto [name, start] = p.open.back();
    p.open.pop_back();
    ProfileEntry& e = p.totals[name];
    e.name = name;
    e.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ++e.calls;
}

TraceRange::TraceRange(Device device, const char* name) : device_(device) {
    if (device_ != Device::cpu) backend_get(device_).range_push(name);
    profile_begin(name);
}

TraceRange::~TraceRange() {
    profile_end();
    if (device_ != Device::cpu) backend_get(device_).range_pop();
}

bool profile_requested(std::string_view name) {
    const char* env = std::getenv("MT_PROFILE");
    if (env == nullptr) return false;
    std::string_view list(env);
    while (!list.empty()) {
        const size_t comma = list.find(',');
        if (list.substr(0, comma) == name) return true;
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return false;
}

}  // namespace mt::core
