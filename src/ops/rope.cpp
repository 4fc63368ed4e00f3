// Entry points of the rotary position embedding: argument checks and dispatch by device.
#include "ops/rope.h"

#include <algorithm>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// in and out: [B, T, H, D], D even, on one device; theta > 0, pos_offset >= 0. Returns the device.
core::Device check_rope_args(const Tensor& in,
                             std::string_view in_arg,
                             const Tensor& out,
                             std::string_view out_arg,
                             double theta,
                             int64_t pos_offset,
                             const Tensor& positions,
                             int64_t position_limit,
                             std::string_view op) {
    check_arg(in, op, in_arg, 4);
    check_arg(out, op, out_arg, 4);
    check_shape(out, in.shape(), op, out_arg);
    MT_CHECK(in.size(3) % 2 == 0,
             "{}: {} has shape {}; the head dim D must be even",
             op,
             in_arg,
             core::shape_str(in.shape()));
    MT_CHECK(theta > 0.0, "{}: theta = {} must be > 0", op, theta);
    MT_CHECK(pos_offset >= 0, "{}: pos_offset = {} must be >= 0", op, pos_offset);
    const core::Device device = check_same_device(op, {{in_arg, in}, {out_arg, out}});
    if (positions.defined()) {
        cpu::check_i32_arg(positions, op, "positions", 2);
        check_shape(positions, {in.size(0), in.size(1)}, op, "positions");
        MT_CHECK(positions.device() == device, "{}: positions must be on the device of {}", op, in_arg);
        // the angle table's rows
        cpu::check_index_range(positions, 0, std::max(in.size(1), position_limit), op, "positions");
    }
    if (device == core::Device::cpu) {
        check_float_arg(in, op, in_arg, 4);
        check_float_arg(out, op, out_arg, 4);
        check_dtype_as(out, in, op, out_arg, in_arg);
    }
    return device;
}

}  // namespace

void rope_fwd(const Tensor& x,
              double theta,
              int64_t pos_offset,
              const Tensor& y,
              const Tensor& positions,
              int64_t position_limit) {
    constexpr std::string_view op = "rope_fwd";
    MT_CALL_KERNEL(rope_fwd,
                   check_rope_args(x, "x", y, "y", theta, pos_offset, positions, position_limit, op),
                   x,
                   theta,
                   pos_offset,
                   y,
                   positions,
                   position_limit);
}

void rope_bwd(const Tensor& dy,
              double theta,
              int64_t pos_offset,
              const Tensor& dx,
              const Tensor& positions,
              int64_t position_limit) {
    constexpr std::string_view op = "rope_bwd";
    MT_CALL_KERNEL(rope_bwd,
                   check_rope_args(dy, "dy", dx, "dx", theta, pos_offset, positions, position_limit, op),
                   dy,
                   theta,
                   pos_offset,
                   dx,
                   positions,
                   position_limit);
}

}  // namespace mt::ops
