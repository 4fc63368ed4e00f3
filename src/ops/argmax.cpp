// Entry point of the row-wise argmax: argument checks and dispatch by device.
#include "ops/argmax.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void argmax_rows(const Tensor& x, const Tensor& out) {
    constexpr std::string_view op = "argmax_rows";
    check_arg(x, op, "x", 2);
    cpu::check_i32_arg(out, op, "out", 1);
    MT_CHECK(x.size(1) > 0, "{}: x has shape {}; a row must not be empty", op, core::shape_str(x.shape()));
    check_shape(out, {x.size(0)}, op, "out");
    const core::Device device = check_same_device(op, {{"x", x}, {"out", out}});
    MT_CALL_KERNEL(argmax_rows, device, x, out);
}

}  // namespace mt::ops
