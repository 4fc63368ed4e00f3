// Hopper (sm_90a) operand tiles of the wgmma products (prim/wgmma.cuh): 16-bit tiles in shared memory in the
// 128-byte-swizzled layout that wgmma reads, filled by cp.async, and their descriptors. Used by the attention kernels
// (attention/flash_wgmma.cuh) and the grouped GEMM (gemm/grouped_gemm_sm90.cu).
// A tile [rows][D] (bf16 or f16, D a multiple of 64) is stored as D / 64 column blocks of [rows][64], each row 128
// bytes with its 16-byte chunks XOR-swizzled by (row % 8); column blocks and tiles are 1024-byte aligned. The same
// bytes serve as a K-major operand (the contraction runs along the columns: Q K^T, x w^T) and as an MN-major one (the
// contraction runs along the rows: P V, dy w, dy^T x).
//   K-major descriptor, 64 rows from row0, k-step kk (16 columns): start = tile + (kk / 4) * rows * 128 + row0 * 128
//     + (kk % 4) * 32, stride byte offset 1024 (8 rows), leading byte offset unused (16).
//   MN-major descriptor, 16 rows from k0, all D columns: start = tile + k0 * 128, leading byte offset rows * 128
//     (the next 64 columns), stride byte offset 1024 (the next 8 rows).
//   The MN-major form serves either operand (the products' TA / TB = 1): flash_bwd_wgmma_fast.cu reads a [keys][64]
//   dS^T tile as the A of dQ = dS K that way, and K from a column offset inside the 64-column block for N = 32; an A
//   operand of 64 MN-major rows is one column block (start it at the block: tile + block * rows * 128).
#pragma once

#include <cstdint>

#include "ops/cuda/prim/cp_async.cuh"
#include "ops/cuda/prim/wgmma.cuh"

namespace mt::ops::cuda {

// Loads rows [r0, r0 + ROWS) of a [t, cols] matrix of 16-bit elements T (row stride rs elements, cols a multiple of
// 8) into a swizzled [ROWS][D] tile; rows >= t and columns >= cols (or >= D) are zero. g must be a mapped address
// even where nothing is valid (it is the source of the zero-filling copies).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void load_tile_sw(uint32_t tile, const T* g, int64_t rs, int r0, int t, int cols, int tid) {
    static_assert(sizeof(T) == 2, "swizzled tiles hold 16-bit elements");
    constexpr int kChunksPerRow = D / 8, kChunks = ROWS * kChunksPerRow;
    static_assert(kChunks % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int c = tid + i * THREADS, r = c / kChunksPerRow, ch = c % kChunksPerRow;
        const bool valid = r0 + r < t && ch * 8 < cols;
        const T* src = valid ? g + static_cast<int64_t>(r0 + r) * rs + ch * 8 : g;
        const uint32_t dst = tile + (ch / 8) * (ROWS * 128) + r * 128 + (((ch % 8) ^ (r % 8)) * 16);
        cp_async16_zfill(dst, src, valid);
    }
}

template <int ROWS>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int kk) {
    return make_desc(tile + (kk / 4) * (ROWS * 128) + row0 * 128 + (kk % 4) * 32, 16, 1024);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0) {
    return make_desc(tile + k0 * 128, ROWS * 128, 1024);
}

}  // namespace mt::ops::cuda
