// Entry points of the exact GELU: argument checks and dispatch by device.
#include "ops/gelu.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void gelu_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "gelu_fwd";
    check_arg(x, op, "x", x.ndim());
    check_arg(y, op, "y", x.ndim());
    check_shape(y, x.shape(), op, "y");
    const core::Device device = check_same_device(op, {{"x", x}, {"y", y}});
    MT_CALL_KERNEL(gelu_fwd, device, x, y);
}

void gelu_bwd(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "gelu_bwd";
    check_arg(x, op, "x", x.ndim());
    for (const NamedArg& a : {NamedArg{"dy", dy}, NamedArg{"dx", dx}}) {
        check_arg(a.tensor, op, a.name, x.ndim());
        check_shape(a.tensor, x.shape(), op, a.name);
    }
    const core::Device device = check_same_device(op, {{"x", x}, {"dy", dy}, {"dx", dx}});
    MT_CALL_KERNEL(gelu_bwd, device, x, dy, dx);
}

}  // namespace mt::ops
