// Warp-level tensor-core products (mma.sync, sm_80 and later), fp32 accumulation, lane (g, t) = (lane / 4, lane % 4):
//   m16n8k16 bf16 (mma_16816): A 16 x 16 row-major in 4 regs, a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8),
//     a3 (g + 8, 2t + 8), each two bf16 (columns +0, +1); B 16 x 8 (k x n) in 2 regs, b0 (k = 2t, n = g),
//     b1 (k = 2t + 8, n = g).
//   m16n8k8 tf32 (mma_tf32): A 16 x 8 in 4 regs, a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
//     B 8 x 8 in 2 regs, b0 (k = t, n = g), b1 (k = t + 4, n = g).
//   C 16 x 8 in 4 floats (both shapes): c0, c1 at (g, 2t + 0/1), c2, c3 at (g + 8, 2t + 0/1).
// Two adjacent bf16 C fragments (n = 16) repack into one A fragment (pack_bf16), which chains products.
#pragma once

#include <cstdint>

#include "ops/cuda/prim/convert.cuh"

namespace mt::ops::cuda {

// c += a b, m16n8k16, bf16 operands.
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b for one 16x8 output tile, k = 8, TF32 operands (bit patterns: to_tf32, tf32_bits, split_tf32).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a b as 3xTF32 from operands split by split_tf32 (kSplit = false: the plain product of the high parts).
template <bool kSplit>
__device__ __forceinline__ void mma_tf32x3(
    float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
    if constexpr (kSplit) {
        mma_tf32(d, al, bh);
        mma_tf32(d, ah, bl);
    }
    mma_tf32(d, ah, bh);
}
// The same product from fp32 fragments (split here).
template <bool kSplit>
__device__ __forceinline__ void mma_f32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) split_tf32<kSplit>(a[i], ah[i], al[i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) split_tf32<kSplit>(b[i], bh[i], bl[i]);
    mma_tf32x3<kSplit>(d, ah, al, bh, bl);
}

}  // namespace mt::ops::cuda
