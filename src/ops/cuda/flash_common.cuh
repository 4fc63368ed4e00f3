// Building blocks of the tensor-core attention kernels: cp.async tile loads into padded shared memory, ldmatrix,
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) and the fragment layouts they use.
//   mma A fragment (16 x 16, row-major) in 4 regs: a0 (r, c), a1 (r + 8, c), a2 (r, c + 8), a3 (r + 8, c + 8) with
//     r = lane / 4, c = (lane % 4) * 2 (+0, +1 in each reg's low and high half).
//   mma B fragment (16 x 8, k x n) in 2 regs: b0 (k = c, n = r), b1 (k = c + 8, n = r).
//   mma C fragment (16 x 8) in 4 floats: c0, c1 at (r, c + 0/1), c2, c3 at (r + 8, c + 0/1).
// Two adjacent C fragments (n = 16) repack into one A fragment, which is how P and dS feed the next product.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/attention_kernels.h"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda::flash {

using bf16 = __nv_bfloat16;

constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4 bytes global -> shared, zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
    const int bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Loads rows [r0, r0 + ROWS) of a [t, D] matrix (row stride rs elements) into shared [ROWS][D + 8] with cp.async;
// rows >= t are zero-filled.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t rs, int r0, int t, int tid) {
    constexpr int kChunksPerRow = D / 8, kChunks = ROWS * kChunksPerRow, kLds = D + 8;
    static_assert(kChunks % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int c = tid + i * THREADS;
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        const bool valid = r0 + r < t;
        const bf16* src = g + static_cast<int64_t>(valid ? r0 + r : 0) * rs + col;
        cp_async_16(smem_u32(s + r * kLds + col), src, valid);
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

// O / l in bf16 and the log-sum-exp (natural log) of this thread's two rows.
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
    const int64_t qrs = static_cast<int64_t>(p.hq) * D;
    bf16* og = static_cast<bf16*>(p.out_w) + (static_cast<int64_t>(b) * t * p.hq + h) * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = row_sum[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + r * 8;
        if (row >= t) continue;
        const float inv = 1.0f / l;
        bf16* orow = og + row * qrs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
            *reinterpret_cast<uint32_t*>(orow + i * 8) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        if (lane % 4 == 0) p.lse[(static_cast<int64_t>(b) * p.hq + h) * t + row] = (row_max[r] + log2f(l)) * kLn2;
    }
}

}  // namespace mt::ops::cuda::flash
