// Test helpers of the vision ops (rope2d, pixel_shuffle): packed images' patch grids as the host grids tensor
// [n, 2] i32, and each patch's row and column index in its image's grid (raster order, images in order).
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt::ops::test {

using ImageGrids = std::vector<std::pair<int32_t, int32_t>>;  // (h, w) per image

inline core::Tensor grids_tensor(const ImageGrids& grids) {
    core::Tensor g = core::Tensor::zeros({static_cast<int64_t>(grids.size()), 2}, core::DType::i32);
    for (size_t k = 0; k < grids.size(); ++k) {
        g.data<int32_t>()[2 * k] = grids[k].first;
        g.data<int32_t>()[2 * k + 1] = grids[k].second;
    }
    return g;
}

inline int64_t grids_patches(const ImageGrids& grids) {
    int64_t p = 0;
    for (const auto& [h, w] : grids) p += int64_t{h} * w;
    return p;
}

// rows[t], cols[t]: patch t's row and column in its image's grid, [P] i32 on the host.
inline std::pair<core::Tensor, core::Tensor> grid_positions(const ImageGrids& grids) {
    const int64_t p = grids_patches(grids);
    core::Tensor rows = core::Tensor::zeros({p}, core::DType::i32), cols = core::Tensor::zeros({p}, core::DType::i32);
    int64_t t = 0;
    for (const auto& [h, w] : grids)
        for (int32_t r = 0; r < h; ++r)
            for (int32_t c = 0; c < w; ++c, ++t) {
                rows.data<int32_t>()[t] = r;
                cols.data<int32_t>()[t] = c;
            }
    return {rows, cols};
}

}  // namespace mt::ops::test
