// The CPU backend and the device -> backend lookup.
#include "core/backend.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/allocator.h"
#include "core/cuda_probe.h"
#include "core/error.h"

namespace mt::core {

namespace {

// The resident set now, in bytes: the second field of /proc/self/statm, in pages.
size_t cpu_rss_bytes() {
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    unsigned long long size = 0, resident = 0;
    const bool ok = std::fscanf(f, "%llu %llu", &size, &resident) == 2;
    std::fclose(f);
    return ok ? static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// The resident set's high-water mark: VmHWM of /proc/self/status (which clear_refs resets), else getrusage's
// ru_maxrss (since the process started; kB on Linux).
size_t cpu_peak_rss_bytes() {
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        unsigned long long kb = 0;
        bool found = false;
        while (!found && std::fgets(line, sizeof(line), f) != nullptr)
            found = std::sscanf(line, "VmHWM: %llu kB", &kb) == 1;
        std::fclose(f);
        if (found) return static_cast<size_t>(kb) * 1024;
    }
    struct rusage usage {};
    return getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<size_t>(usage.ru_maxrss) * 1024 : 0;
}

}  // namespace

void* Backend::alloc_pinned(size_t bytes) {
    return cpu_alloc(bytes);
}

void Backend::free_pinned(void* ptr) {
    cpu_free(ptr);
}

void Backend::begin_capture() {
    throw Error(ExitCode::device, "the " + name() + " backend has no CUDA graphs");
}

uint64_t Backend::end_capture(bool) {
    throw Error(ExitCode::device, "the " + name() + " backend has no CUDA graphs");
}

void Backend::graph_launch(uint64_t) {
    throw Error(ExitCode::device, "the " + name() + " backend has no CUDA graphs");
}

void Backend::graph_destroy(uint64_t) {}

namespace {

class CpuBackend final : public Backend {
   public:
    std::string name() const override {
        return "cpu";
    }
    void* alloc(size_t bytes) override {
        return cpu_alloc(bytes);
    }
    void free(void* ptr, size_t) override {
        cpu_free(ptr);
    }
    void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
        std::memmove(dst, src, bytes);
    }
    void memset_zero(void* ptr, size_t bytes) override {
        std::memset(ptr, 0, bytes);
    }
    void synchronize() override {}
    size_t bytes_in_use() const override {
        return cpu_rss_bytes();
    }
    size_t reserved_bytes() const override {
        return cpu_rss_bytes();
    }
    size_t peak_bytes() const override {
        return cpu_peak_rss_bytes();
    }
    void reset_peak() override {
        // "5" resets the high-water mark to the current RSS (Linux 4.0 and later, proc(5)).
        if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
            std::fputs("5", f);
            std::fclose(f);
        }
    }
    size_t total_bytes() const override {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
    }
};

}  // namespace

Backend& backend_get(Device device) {
    static CpuBackend cpu;
    if (device == Device::cpu) return cpu;
    Backend* cuda = cuda_backend_instance();
    if (cuda == nullptr)
        fail_hint(ExitCode::device,
                  "run with run.device = \"cpu\", or on a machine with an NVIDIA GPU",
                  "no CUDA device is available: {}",
                  cuda_describe());
    return *cuda;
}

bool backend_available(Device device) {
    return device == Device::cpu || cuda_backend_instance() != nullptr;
}

}  // namespace mt::core
