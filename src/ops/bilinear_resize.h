// Bilinear resize of the ViT's learned position table to each image's patch grid (multimodal.md §1, vision.pos =
// "learned"), exactly PyTorch's F.interpolate(table.permute(2, 0, 1)[None], size=(h, w), mode="bilinear",
// align_corners=False, antialias=False), i.e. upsample_bilinear2d. align_corners = False treats a coordinate as the
// centre of a cell of unit width, so a grid and its resize cover the same extent (the half-pixel convention of image
// resizing and of ViT position tables, e.g. timm's resample_abs_pos_embed); True would pin the corner cells' centres
// and stretch a 1-cell axis from nothing. Per axis, from `in` samples to `out` (bilinear_taps):
//   src = max(0, (i + 0.5) in / out - 0.5),  i0 = floor(src),  i1 = min(i0 + 1, in - 1),  l1 = src - i0,  l0 = 1 - l1
// with in == out the identity (l1 = 0, PyTorch's own special case) and i1 == i0 merged into one tap of weight 1, so
// that y[i, j] = sum over the row taps (a, la) and column taps (b, lb) of la lb table[a, b] and a grid equal to the
// table's is an exact copy.
//   table: [Hm, Wm, C] f32|f64 (CUDA: bf16|f16|f32)
//   grids: [n, 2] i32, (h, w) of each image's patch grid, both > 0 (any size: up- or down-sampling). Always a host
//          tensor, as for ops/pixel_shuffle.h: shape metadata the data pipeline knows on the host; the CUDA kernels
//          copy small per-image tap tables to the device.
//   y:     [P, C], P = sum of h w, the dtype of table: image k's h w rows in raster order of its grid after those of
//          images 0..k-1 (the ViT's packed patch order); written (=). Saves nothing.
// _bwd: dtable [Hm, Wm, C] accumulated (+=, a parameter gradient; CUDA: bf16|f16|f32 whatever the dtype of dy) from
// dy [P, C]. Each table cell gathers its own sum (image by image, row taps outer, column taps inner, in output order:
// bilinear_sources), with no atomics, so both devices are deterministic.
#pragma once

#include <vector>

#include "ops/op_common.h"

namespace mt::ops {

void bilinear_resize_fwd(const Tensor& table, const Tensor& grids, const Tensor& y);
void bilinear_resize_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dtable);

// Output coordinate i of one axis reads input coordinates i0 and i1 with weights l0 and l1 (l0 + l1 = 1; i1 = i0 and
// l1 = 0 where one input suffices).
struct BilinearTap {
    int32_t i0 = 0, i1 = 0;
    double l0 = 1.0, l1 = 0.0;
};
// The taps of the out output coordinates of an axis resized from `in` samples (in, out > 0), PyTorch's rule above.
std::vector<BilinearTap> bilinear_taps(int64_t in, int64_t out);

// The transpose of bilinear_taps(in, out): input coordinate a is read by the output coordinates out[e] with weights
// weight[e], e in [first[a], first[a + 1]), in increasing output order (zero weights left out).
struct BilinearSources {
    std::vector<int32_t> first, out;
    std::vector<double> weight;
};
BilinearSources bilinear_sources(int64_t in, int64_t out);

}  // namespace mt::ops
