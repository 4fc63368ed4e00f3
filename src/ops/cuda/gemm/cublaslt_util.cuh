// Small helpers shared by the cuBLASLt-based ops (linear.cu, grouped_linear.cu): status checks, dtype mapping and
// operand alignment.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace mt::ops::cuda::lt {

// Fails (exit 5) naming the cuBLASLt call and the op on any status but success.
inline void check(cublasStatus_t status, const char* what, const char* op) {
    if (status != CUBLAS_STATUS_SUCCESS)
        core::fail(core::ExitCode::device, "cuBLASLt error {} in {} ({})", static_cast<int>(status), what, op);
}

inline cudaDataType cuda_type(core::DType dtype) {
    return dtype == core::DType::bf16 ? CUDA_R_16BF : (dtype == core::DType::f16 ? CUDA_R_16F : CUDA_R_32F);
}

// The largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by operand alignment.
inline uint32_t alignment_of(const void* ptr) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    uint32_t a = 256;
    while (a > 1 && addr % a != 0) a /= 2;
    return a;
}

}  // namespace mt::ops::cuda::lt
