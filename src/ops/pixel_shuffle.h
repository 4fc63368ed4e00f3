// The projector's 2x2 pixel shuffle over packed images (multimodal.md §2) and its inverse.
//   x:     [P, C] the patches of n images concatenated in image order, each image's h w patches in raster order of
//          its grid
//   grids: [n, 2] i32, (h, w) of each image's patch grid, both even and > 0, sum of h w = P. Always a host tensor,
//          whatever the device of x: it is shape metadata (the data pipeline knows it on the host), and the checks
//          read it; the CUDA kernel copies a small per-image table (first output row, grid width) to the device.
//   y:     [P/4, 4C]: image k's (h/2)(w/2) output cells in raster order, after those of images 0..k-1. Cell (r, c)
//          concatenates the patch vectors at (2r, 2c), (2r, 2c+1), (2r+1, 2c), (2r+1, 2c+1), in that order:
//            y[o_k + r (w/2) + c, q C + j] = x[4 o_k + (2r + q/2) w + 2c + q%2, j],  q = 0..3, j < C,
//          o_k = (sum over images l < k of h_l w_l) / 4.
// A pure copy (bitwise): f32|f64 (CUDA: bf16|f16|f32), y the dtype of x; y must not alias x.
// _bwd is the inverse permutation: dx [P, C] written (=) from dy [P/4, 4C] (dx must not alias dy). Saves nothing.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void pixel_shuffle_fwd(const Tensor& x, const Tensor& grids, const Tensor& y);
void pixel_shuffle_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dx);

}  // namespace mt::ops
