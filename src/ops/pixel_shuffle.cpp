// Entry points of the 2x2 pixel shuffle: argument checks (including the host grid values) and dispatch by device.
#include "ops/pixel_shuffle.h"

#include "ops/cpu/image_grids.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// patches: [P, C], cells: [P/4, 4C] on one device; grids a host i32 [n, 2] of even positive (h, w) whose sum of h w is
// P. Returns the device.
core::Device check_pixel_shuffle_args(const Tensor& patches,
                                      std::string_view patches_arg,
                                      const Tensor& grids,
                                      const Tensor& cells,
                                      std::string_view cells_arg,
                                      std::string_view op) {
    check_arg(patches, op, patches_arg, 2);
    check_arg(cells, op, cells_arg, 2);
    const int64_t total = cpu::check_image_grids(grids, op, /*even=*/true);
    const int64_t p = patches.size(0), c = patches.size(1);
    MT_CHECK(total == p,
             "{}: the grids hold {} patches but {} has {} rows ({})",
             op,
             total,
             patches_arg,
             p,
             core::shape_str(patches.shape()));
    check_shape(cells, {p / 4, 4 * c}, op, cells_arg);
    const core::Device device = check_same_device(op, {{patches_arg, patches}, {cells_arg, cells}});
    MT_CHECK(
        patches.numel() == 0 || patches.raw() != cells.raw(), "{}: {} must not alias {}", op, cells_arg, patches_arg);
    return device;
}

}  // namespace

void pixel_shuffle_fwd(const Tensor& x, const Tensor& grids, const Tensor& y) {
    constexpr std::string_view op = "pixel_shuffle_fwd";
    MT_CALL_KERNEL(pixel_shuffle_fwd, check_pixel_shuffle_args(x, "x", grids, y, "y", op), x, grids, y);
}

void pixel_shuffle_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "pixel_shuffle_bwd";
    MT_CALL_KERNEL(pixel_shuffle_bwd, check_pixel_shuffle_args(dx, "dx", grids, dy, "dy", op), grids, dy, dx);
}

}  // namespace mt::ops
