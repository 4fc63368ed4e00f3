// The CPU backend and the device -> backend lookup.
#include "core/backend.h"

#include <cstring>

#include "core/allocator.h"
#include "core/cuda_probe.h"
#include "core/error.h"

namespace mt::core {

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
