// Hopper (sm_90a) building blocks of the wgmma attention kernels: the swizzled operand tiles, their cp.async loads
// and descriptors of prim/wgmma_tile.cuh (which documents the layout), and their TMA loads from the [B, T, H, d]
// tensor maps (the instructions, fences and barriers are in prim/wgmma.cuh and prim/tma.cuh). A tile [rows][D] is
// bf16 with D a multiple of 64: the tile width, flash_tile_d, of a head dim up to D.
// Accumulators use the mma.sync C layout within each warp (warp w of the warpgroup holds rows 16 w .. 16 w + 15), so
// the helpers of flash_common.cuh (pack_a, the softmax) apply unchanged.
#pragma once

#include <cstdint>

#include "ops/cuda/attention/flash_common.cuh"
#include "ops/cuda/prim/tma.cuh"
#include "ops/cuda/prim/wgmma.cuh"
#include "ops/cuda/prim/wgmma_tile.cuh"

namespace mt::ops::cuda::flash {

// TMA: rows [row0, row0 + rows) of head `head`, batch `batch` of a [B, T, H, d] tensor map into the swizzled tile
// layout of prim/wgmma_tile.cuh (D / 64 boxes [rows][64], one per column block); rows past T and columns past d (a head
// dim below the tile width D) arrive as zeros.
template <int D>
__device__ __forceinline__ void tma_load_tile(
    uint32_t tile, const void* map, uint32_t bar, int rows, int head, int row0, int batch) {
#pragma unroll
    for (int c = 0; c < D / 64; ++c) tma_load_4d(tile + c * rows * 128, map, bar, c * 64, head, row0, batch);
}

}  // namespace mt::ops::cuda::flash
