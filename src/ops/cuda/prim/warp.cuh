// Warp reductions by fixed butterflies: every participating lane gets the same result, the same on every run (the
// summation order is fixed by the lane masks, never by timing).
#pragma once

namespace mt::ops::cuda {

// Sum over the 32 lanes (lanes xor 16, 8, 4, 2, 1). A: float, double or an integer type.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Maximum over the 32 lanes.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum and maximum over the four lanes that hold one row of an mma.sync C fragment (lanes 4r .. 4r + 3: xor 1, then
// xor 2).
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

}  // namespace mt::ops::cuda
