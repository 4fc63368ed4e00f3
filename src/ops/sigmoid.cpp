// Entry points of the elementwise sigmoid: argument checks, then the CPU reference (no CUDA path yet).
#include "ops/sigmoid.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/cpu/kda_kernels.h"

namespace mt::ops {

namespace {

void check_like(const Tensor& t, const Tensor& ref, std::string_view op, const char* name, const char* ref_name) {
    check_float_arg(t, op, name, ref.ndim());
    check_shape(t, ref.shape(), op, name);
    cpu::check_dtype_as(t, ref, op, name, ref_name);
}

}  // namespace

void sigmoid_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "sigmoid_fwd";
    check_same_device(op, {{"x", x}, {"y", y}});
    check_float_arg(x, op, "x", x.ndim());
    check_like(y, x, op, "y", "x");
    MT_DISPATCH_FLOAT(x.dtype(), op, cpu::sigmoid_fwd(x.data<scalar_t>(), y.data<scalar_t>(), x.numel()));
}

void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "sigmoid_bwd";
    check_same_device(op, {{"y", y}, {"dy", dy}, {"dx", dx}});
    check_float_arg(y, op, "y", y.ndim());
    check_like(dy, y, op, "dy", "y");
    check_like(dx, y, op, "dx", "y");
    MT_DISPATCH_FLOAT(
        y.dtype(), op, cpu::sigmoid_bwd(y.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), y.numel()));
}

}  // namespace mt::ops
