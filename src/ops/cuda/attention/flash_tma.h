// TMA tensor maps for the attention kernels: a [B, T, H, D] bf16 tensor (row-major, as in ops/attention.h) read in
// boxes of [rows][64] (one head, one batch) in the 128-byte-swizzled layout of flash_wgmma.cuh, so that a [rows][D]
// tile is D / 64 boxes, one per 64-column block. Rows past T arrive as zeros.
#pragma once

#include <cuda.h>

namespace mt::ops::cuda {

CUtensorMap make_bthd_tensor_map(const void* base, int b, int t, int h, int d, int rows);

}  // namespace mt::ops::cuda
