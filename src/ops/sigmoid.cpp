// Entry points of the elementwise sigmoid: argument checks, then the CPU reference or the CUDA kernel.
#include "ops/sigmoid.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void sigmoid_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "sigmoid_fwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"y", y}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_arg(x, op, "x", x.ndim());
    check_arg(y, op, "y", x.ndim());
    check_shape(y, x.shape(), op, "y");
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(sigmoid_fwd, core::Device::cuda, x, y);
    }
    MT_CALL_KERNEL(sigmoid_fwd, core::Device::cpu, x, y);
}

void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "sigmoid_bwd";
    const core::Device device = check_same_device(op, {{"y", y}, {"dy", dy}, {"dx", dx}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_arg(y, op, "y", y.ndim());
    for (const NamedArg& a : {NamedArg{"dy", dy}, NamedArg{"dx", dx}}) {
        check_arg(a.tensor, op, a.name, y.ndim());
        check_shape(a.tensor, y.shape(), op, a.name);
    }
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(sigmoid_bwd, core::Device::cuda, y, dy, dx);
    }
    MT_CALL_KERNEL(sigmoid_bwd, core::Device::cpu, y, dy, dx);
}

}  // namespace mt::ops
