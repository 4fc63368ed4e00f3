// Building blocks of the tensor-core attention kernels: cp.async tile loads into padded shared memory, the ldmatrix
// fragment loads of mma.sync m16n8k16 (bf16 in, fp32 accumulate; fragment layouts in prim/mma.cuh) from those tiles,
// and the output store. Two adjacent C fragments (n = 16) repack into one A fragment (pack_a), which is how P and dS
// feed the next product.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/prim/cp_async.cuh"
#include "ops/cuda/prim/ldmatrix.cuh"
#include "ops/cuda/prim/mma.cuh"
#include "ops/cuda/prim/warp.cuh"

namespace mt::ops::cuda::flash {

using bf16 = __nv_bfloat16;

// Calls launch(d, causal) with the tile width (64 or 128, flash_tile_d) and the mask kind (causal or bidirectional)
// as types (std::integral_constant): each flash kernel is instantiated for both, so the causal one carries no
// bidirectional test and the bidirectional one no causal one.
template <typename Launch>
void launch_flash(const AttnParams& p, Launch&& launch) {
    auto with_d = [&](auto causal) {
        if (flash_tile_d(p.d) == 64)
            launch(std::integral_constant<int, 64>{}, causal);
        else
            launch(std::integral_constant<int, 128>{}, causal);
    };
    if (p.causal)
        with_d(std::true_type{});
    else
        with_d(std::false_type{});
}

constexpr float kLn2 = 0.6931471805599453f;

// Loads rows [r0, r0 + ROWS) of a [t, cols] matrix (row stride rs elements, cols <= D a multiple of 8) into shared
// [ROWS][D + 8] with cp.async; rows >= t and columns >= cols are zero-filled (a head dim below the tile width: the
// zero columns add nothing to Q K^T and give zero output columns, which are not stored).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t rs, int r0, int t, int cols, int tid) {
    constexpr int kChunksPerRow = D / 8, kChunks = ROWS * kChunksPerRow, kLds = D + 8;
    static_assert(kChunks % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int c = tid + i * THREADS;
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        const bool valid = r0 + r < t && col < cols;
        const bf16* src = valid ? g + static_cast<int64_t>(r0 + r) * rs + col : g;
        cp_async16_zfill(smem_u32(s + r * kLds + col), src, valid);
    }
}

// A fragment of rows [r0, r0 + 16), cols [c0, c0 + 16) of a row-major shared tile with row stride lds.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int lds, int r0, int c0, int lane) {
    const int r = r0 + (lane % 8) + ((lane / 8) % 2) * 8, c = c0 + (lane / 16) * 8;
    ldmatrix_x4(a, smem_u32(s + r * lds + c));
}
// B fragments of two n-blocks (n in [n0, n0 + 16)) over k in [k0, k0 + 16) when the tile is stored [n][k]
// (k contiguous): b[0], b[1] for n-block n0, b[2], b[3] for n-block n0 + 8.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const bf16* s, int lds, int n0, int k0, int lane) {
    const int n = n0 + (lane % 8) + (lane / 16) * 8, k = k0 + ((lane / 8) % 2) * 8;
    ldmatrix_x4(b, smem_u32(s + n * lds + k));
}
// The same when the tile is stored [k][n] (n contiguous), through ldmatrix.trans.
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* s, int lds, int k0, int n0, int lane) {
    const int k = k0 + (lane % 8) + ((lane / 8) % 2) * 8, n = n0 + (lane / 16) * 8;
    ldmatrix_x4_trans(b, smem_u32(s + k * lds + n));
}

// Repacks C fragments j = 2 kk and 2 kk + 1 (16 columns) of an accumulator into an A fragment (bf16).
template <int N>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&acc)[N][4], int kk) {
    a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// O / l in bf16 and the log-sum-exp (natural log) of this thread's two rows; with p.max_logit, also their row max
// (row_max holds the scaled scores' max in base 2, so times ln 2). Columns from p.d (the tile's zero padding) are not
// stored.
template <int D>
__device__ __forceinline__ void store_output(const AttnParams& p,
                                             const float (&o)[D / 8][4],
                                             const float (&row_max)[2],
                                             const float (&row_sum)[2],
                                             int b,
                                             int h,
                                             int row0,
                                             int lane) {
    const int t = p.t;
    const int64_t qrs = static_cast<int64_t>(p.hq) * p.d;
    bf16* og = static_cast<bf16*>(p.out_w) + (static_cast<int64_t>(b) * t * p.hq + h) * p.d;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = row_sum[r];
        l = quad_sum(l);
        const int row = row0 + r * 8;
        if (row >= t) continue;
        const float inv = 1.0f / l;
        bf16* orow = og + row * qrs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
            if (i * 8 < p.d)
                *reinterpret_cast<uint32_t*>(orow + i * 8) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        if (lane % 4 != 0) continue;
        const int64_t at = (static_cast<int64_t>(b) * p.hq + h) * t + row;
        p.lse[at] = (row_max[r] + log2f(l)) * kLn2;
        if (p.max_logit != nullptr) p.max_logit[at] = row_max[r] * kLn2;
    }
}

}  // namespace mt::ops::cuda::flash
