// CPU-only build: the CUDA probe answers "absent" and there is no CUDA backend.
#ifndef MT_HAVE_CUDA
#include "core/backend.h"
#include "core/cuda_probe.h"

namespace mt::core {

bool cuda_compiled() {
    return false;
}
int cuda_device_count() {
    return 0;
}
std::string cuda_describe() {
    return "CUDA path not compiled (nvcc was not found at build time)";
}
Backend* cuda_backend_instance() {
    return nullptr;
}

}  // namespace mt::core
#endif
