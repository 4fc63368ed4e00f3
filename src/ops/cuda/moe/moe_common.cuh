// Helpers shared by the CUDA MoE kernels (moe_router.cu, moe_permute.cu, moe_unpermute.cu, moe_balance.cu): the
// "element type or f32" dispatch of the routing tensors and the block width of the per-row kernels.
#pragma once

#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

// Threads per block for a kernel that walks one row of c elements, vec at a time (32 to 256).
inline int moe_row_threads(int64_t c, int vec) {
    const int64_t need = (c + vec - 1) / vec;
    return need >= 256 ? 256 : (need >= 128 ? 128 : (need >= 64 ? 64 : 32));
}

}  // namespace mt::ops::cuda

// Runs the body with NAME bound to float when dtype is f32, else to T (a routing tensor that is f32 or of the
// activations' dtype).
#define MT_MOE_F32_OR(dtype, T, NAME, ...)       \
    do {                                         \
        if ((dtype) == ::mt::core::DType::f32) { \
            using NAME = float;                  \
            __VA_ARGS__;                         \
        } else {                                 \
            using NAME = T;                      \
            __VA_ARGS__;                         \
        }                                        \
    } while (0)
