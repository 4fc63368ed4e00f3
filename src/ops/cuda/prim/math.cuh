// Scalar math of the CUDA kernels: base-2 exponentials on the SFU alone and the overflow-free sigmoid.
#pragma once

namespace mt::ops::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the SFU alone (ex2.approx.ftz: ~2 ulp, results below 2^-126 flushed to zero): exp2f adds a compare and two
// conditional multiplies around it for the subnormal results, expf ~10 instructions.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// e^x by fast_exp2 (x scaled to base 2 first: ~2^-17 relative for |x| < 100, far below the TF32 rounding of the
// operands it forms; the factors it flushes to zero multiply operands whose products vanish in fp32 sums anyway).
// expf's accurate path costs ~10 instructions, __expf's subnormal handling 4.
__device__ __forceinline__ float exp_ftz(float x) {
    return fast_exp2(x * kLog2e);
}

// 1 / (1 + e^-x), with the exponential of a non-positive argument only (no overflow for large |x|).
__device__ __forceinline__ float sigmoid_f32(float x) {
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

}  // namespace mt::ops::cuda
