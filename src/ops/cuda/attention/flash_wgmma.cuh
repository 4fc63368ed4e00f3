// Hopper (sm_90a) building blocks of the wgmma attention kernels: tiles in shared memory in the 128-byte-swizzled
// layout that wgmma reads, filled by cp.async or TMA, and their descriptors (the instructions, fences and barriers are
// in prim/wgmma.cuh and prim/tma.cuh).
// A tile [rows][D] (bf16, D a multiple of 64: the tile width, flash_tile_d, of a head dim up to D) is stored as
// D / 64 column blocks of [rows][64], each row 128 bytes with its 16-byte chunks XOR-swizzled by (row % 8); column
// blocks and tiles are 1024-byte aligned. The same bytes
// serve as a K-major operand (the contraction runs along D: Q K^T) and as an MN-major one (the contraction runs
// along the rows: P V).
//   K-major descriptor, 64 rows from row0, k-step kk (16 columns): start = tile + (kk / 4) * rows * 128 + row0 * 128
//     + (kk % 4) * 32, stride byte offset 1024 (8 rows), leading byte offset unused (16).
//   MN-major descriptor, 16 rows from k0, all D columns: start = tile + k0 * 128, leading byte offset rows * 128
//     (the next 64 columns), stride byte offset 1024 (the next 8 rows).
//   The MN-major form serves either operand (the products' TA / TB = 1): flash_bwd_wgmma_fast.cu reads a [keys][64]
//   dS^T tile as the A of dQ = dS K that way, and K from a column offset inside the 64-column block for N = 32.
// Accumulators use the mma.sync C layout within each warp (warp w of the warpgroup holds rows 16 w .. 16 w + 15), so
// the helpers of flash_common.cuh (pack_a, the softmax) apply unchanged.
#pragma once

#include <cstdint>

#include "ops/cuda/attention/flash_common.cuh"
#include "ops/cuda/prim/tma.cuh"
#include "ops/cuda/prim/wgmma.cuh"

namespace mt::ops::cuda::flash {

// Loads rows [r0, r0 + ROWS) of a [t, cols] matrix (row stride rs elements, cols <= D a multiple of 8) into a swizzled
// tile; rows >= t and columns >= cols are zero.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw(
    uint32_t tile, const bf16* g, int64_t rs, int r0, int t, int cols, int tid) {
    constexpr int kChunksPerRow = D / 8, kChunks = ROWS * kChunksPerRow;
    static_assert(kChunks % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int c = tid + i * THREADS, r = c / kChunksPerRow, ch = c % kChunksPerRow;
        const bool valid = r0 + r < t && ch * 8 < cols;
        const bf16* src = valid ? g + static_cast<int64_t>(r0 + r) * rs + ch * 8 : g;
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

// TMA: rows [row0, row0 + rows) of head `head`, batch `batch` of a [B, T, H, d] tensor map into the swizzled tile
// layout above (D / 64 boxes [rows][64], one per column block); rows past T and columns past d (a head dim below the
// tile width D) arrive as zeros.
template <int D>
__device__ __forceinline__ void tma_load_tile(
    uint32_t tile, const void* map, uint32_t bar, int rows, int head, int row0, int batch) {
#pragma unroll
    for (int c = 0; c < D / 64; ++c) tma_load_4d(tile + c * rows * 128, map, bar, c * 64, head, row0, batch);
}

}  // namespace mt::ops::cuda::flash
