// OpenBLAS's kernel choice (core/blas_kernels.h).
#include "core/blas_kernels.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

// OpenBLAS's own (cblas.h declares it; declared here so core includes no library header).
extern "C" char* openblas_get_corename(void);

namespace mt::core {

const char* blas_kernel_name() {
    return openblas_get_corename();
}

void blas_select_kernels(char** argv) {
    if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::strcmp(openblas_get_corename(), "Prescott") != 0) return;
    __builtin_cpu_init();
    const char* kernels = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        kernels = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        kernels = "Haswell";
    if (kernels == nullptr) return;
    // Set even if the exec fails, so that a child process this one starts gets the right kernels.
    setenv("OPENBLAS_CORETYPE", kernels, 1);
    execv("/proc/self/exe", argv);
}

}  // namespace mt::core
