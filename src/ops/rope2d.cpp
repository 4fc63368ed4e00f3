// Entry points of the 2-D rotary position embedding: argument checks and dispatch by device.
#include "ops/rope2d.h"

#include <cstdint>
#include <limits>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// in and out: [T, H, D], D divisible by 4, on one device; rows and cols [T] i32 on that device, >= 0 (host values
// checked); theta > 0. Returns the device.
core::Device check_rope2d_args(const Tensor& in,
                               std::string_view in_arg,
                               const Tensor& rows,
                               const Tensor& cols,
                               const Tensor& out,
                               std::string_view out_arg,
                               double theta,
                               std::string_view op) {
    check_arg(in, op, in_arg, 3);
    check_arg(out, op, out_arg, 3);
    check_shape(out, in.shape(), op, out_arg);
    MT_CHECK(in.size(2) % 4 == 0,
             "{}: {} has shape {}; the head dim D must be divisible by 4 (two rotated halves of D/4 pairs)",
             op,
             in_arg,
             core::shape_str(in.shape()));
    MT_CHECK(theta > 0.0, "{}: theta = {} must be > 0", op, theta);
    const core::Device device = check_same_device(op, {{in_arg, in}, {out_arg, out}});
    constexpr int64_t kIndexEnd = int64_t{std::numeric_limits<int32_t>::max()} + 1;
    for (const NamedArg& a : {NamedArg{"rows", rows}, NamedArg{"cols", cols}}) {
        cpu::check_i32_arg(a.tensor, op, a.name, 1);
        check_shape(a.tensor, {in.size(0)}, op, a.name);
        MT_CHECK(a.tensor.device() == device, "{}: {} must be on the device of {}", op, a.name, in_arg);
        cpu::check_index_range(a.tensor, 0, kIndexEnd, op, a.name);
    }
    return device;
}

}  // namespace

void rope2d_fwd(const Tensor& x, const Tensor& rows, const Tensor& cols, const Tensor& y, double theta) {
    constexpr std::string_view op = "rope2d_fwd";
    MT_CALL_KERNEL(rope2d_fwd, check_rope2d_args(x, "x", rows, cols, y, "y", theta, op), x, rows, cols, y, theta);
}

void rope2d_bwd(const Tensor& dy, const Tensor& rows, const Tensor& cols, const Tensor& dx, double theta) {
    constexpr std::string_view op = "rope2d_bwd";
    MT_CALL_KERNEL(rope2d_bwd, check_rope2d_args(dy, "dy", rows, cols, dx, "dx", theta, op), dy, rows, cols, dx, theta);
}

}  // namespace mt::ops
