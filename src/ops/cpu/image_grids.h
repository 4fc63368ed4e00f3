// The check of the packed images' patch grids that the vision ops share (ops/pixel_shuffle.h, ops/bilinear_resize.h):
// a host i32 [n, 2] tensor of (h, w) per image, which the entry points read on the host whatever the op's device.
#pragma once

#include <string_view>

#include "ops/cpu/checks.h"

namespace mt::ops::cpu {

// Fails (exit 1, naming the op and the first bad image) unless grids is a contiguous host i32 [n, 2] tensor whose every
// h and w is > 0 (and even with `even`, for the 2 x 2 pixel shuffle). Returns the patches they hold, the sum of h w.
inline int64_t check_image_grids(const Tensor& grids, std::string_view op, bool even) {
    check_i32_arg(grids, op, "grids", 2);
    MT_CHECK(grids.size(1) == 2,
             "{}: grids has shape {}, expected [n, 2] (h, w per image)",
             op,
             core::shape_str(grids.shape()));
    MT_CHECK(grids.device() == core::Device::cpu,
             "{}: grids must be a host tensor (shape metadata, read by the checks), not on the {}",
             op,
             core::device_name(grids.device()));
    const int32_t* g = grids.data<int32_t>();
    int64_t total = 0;
    for (int64_t k = 0; k < grids.size(0); ++k) {
        const int64_t h = g[2 * k], w = g[2 * k + 1];
        MT_CHECK(h > 0 && w > 0 && (!even || (h % 2 == 0 && w % 2 == 0)),
                 "{}: image {} has a {}x{} patch grid; h and w must be {}> 0",
                 op,
                 k,
                 h,
                 w,
                 even ? "even and " : "");
        total += h * w;
    }
    return total;
}

}  // namespace mt::ops::cpu
