// Element conversions of the CUDA kernels: bf16 / f16 / f32 to and from f32 (stores round to nearest even, as
// core::f32_to_bf16 on the host), two-element packs, and the TF32 operand forms of the tensor-core products (rounded,
// kept as float bit patterns, split into high and low parts for 3xTF32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mt::ops::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Element <-> f32.
__device__ __forceinline__ float to_f32(float x) {
    return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(f16 x) {
    return __half2float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) {
    return __float2half_rn(x);
}

// Two consecutive 2-byte elements <-> two f32 (one conversion instruction each way).
__device__ __forceinline__ float2 pair_to_f32(__nv_bfloat162 h) {
    return __bfloat1622float2(h);
}
__device__ __forceinline__ float2 pair_to_f32(__half2 h) {
    return __half22float2(h);
}
template <typename T>
struct Pair;
template <>
struct Pair<bf16> {
    using type = __nv_bfloat162;
    __device__ static type from(float a, float b) {
        return __floats2bfloat162_rn(a, b);
    }
};
template <>
struct Pair<f16> {
    using type = __half2;
    __device__ static type from(float a, float b) {
        return __floats2half2_rn(a, b);
    }
};

// Two floats as one 32-bit register of two bf16 (lo in the low half): the operand form of mma_16816.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// x rounded to nearest TF32 (10 mantissa bits; ties away from zero, as cvt.rna) in two integer operations: add half
// of the last kept bit, clear the 13 dropped bits. A carry out of the mantissa bumps the exponent, which is the
// rounding's own overflow; inf stays inf, NaN stays NaN unless its payload lies only in the dropped bits. The low 13
// bits of the result are zero. cvt.rna.tf32.f32 runs on the conversion pipe at an eighth of the fp32 rate, and it
// was what limited the fragment loops of every KDA kernel (2026-12-01: prep, the scans, chunk_mm and chunk_smem
// 10-30% faster without it); Veltkamp's splitting (c = 8193 x, c - (c - x)), used until 2026-12-01 (fifth
// session), took three fp32 operations and needed |x| < FLT_MAX / 8193. (kda::kAnchorMaxNats keeps that bound
// anyway.)
__device__ __forceinline__ uint32_t to_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

// x rounded to TF32, kept as a float: tiles of these go to the MMA as bit patterns (frag_*_f on uint32_t), with
// no conversion at the reads. Rounding is idempotent (to_tf32 of such a value returns it), so a consumer that does
// round gets the same operand.
__device__ __forceinline__ float tf32_bits(float x) {
    return __uint_as_float(to_tf32(x));
}

// A 16-bit value as a TF32 operand: bf16 and f16 values are exact in TF32, so no rounding step.
template <typename T>
__device__ __forceinline__ uint32_t tf32_exact(T x) {
    return __float_as_uint(to_f32(x));
}

// 3xTF32: x = hi + lo with both parts TF32, and d += a b as a_lo b_hi + a_hi b_lo + a_hi b_hi (mma_tf32x3), which
// keeps most of fp32's precision. kSplit = false is the plain single TF32 product. hi is x truncated to TF32 (one AND;
// rounding costs more, and with Veltkamp's three operations it was a quarter of chunk_smem's instructions): lo = x - hi
// is exact and below 2^-10 |x|, the MMA reads lo's top 19 bits (an error below 2^-20 |x|), and the dropped a_lo b_lo
// term is below 2^-20 too: ~2^-19 relative overall against plain TF32's ~2^-11. hi has its low 13 bits zero, so it is
// the same operand whether the MMA truncates or rounds its inputs.
template <bool kSplit>
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
    if constexpr (kSplit) {
        hi = __float_as_uint(x) & 0xffffe000u;
        lo = __float_as_uint(__fsub_rn(x, __uint_as_float(hi)));
    } else {
        hi = to_tf32(x);
        lo = 0u;
    }
}

}  // namespace mt::ops::cuda
