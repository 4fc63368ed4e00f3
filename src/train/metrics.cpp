// JSONL metrics writer.
#include "train/metrics.h"

#include <chrono>
#include <cmath>

#include "core/error.h"

namespace mt::train {

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
    if (path.empty()) return;
    file_ = std::fopen(path.c_str(), "a");
    if (file_ == nullptr) core::fail(core::ExitCode::usage, "cannot open the metrics log for writing [{}]", path);
}

MetricsLog::~MetricsLog() {
    if (file_) std::fclose(file_);
}

void MetricsLog::write(int64_t step, const std::string& kind, const nlohmann::json& fields) {
    if (file_ == nullptr) return;
    nlohmann::json line = {{"step", step}, {"time", unix_seconds()}, {"kind", kind}};
    nlohmann::json nonfinite = nlohmann::json::array();
    for (const auto& [key, value] : fields.items()) {
        if (value.is_number_float() && !std::isfinite(value.get<double>())) {
            line[key] = nullptr;
            nonfinite.push_back(key);
        } else {
            line[key] = value;
        }
    }
    if (!nonfinite.empty()) line["nonfinite"] = nonfinite;
    const std::string text = line.dump() + "\n";
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
        core::fail(core::ExitCode::usage, "cannot write the metrics log [{}]", path_);
}

double unix_seconds() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace mt::train
