// Entry points of the elementwise sigmoid: argument checks, then the CPU reference or the CUDA kernel.
#include "ops/sigmoid.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/cpu/kda_kernels.h"
#include "ops/cuda/cuda_ops.h"

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
    if (check_same_device(op, {{"x", x}, {"y", y}}) == core::Device::cuda) {
        check_arg(x, op, "x", x.ndim());
        check_arg(y, op, "y", x.ndim());
        check_shape(y, x.shape(), op, "y");
        return cuda::sigmoid_fwd(x, y);
    }
    check_float_arg(x, op, "x", x.ndim());
    check_like(y, x, op, "y", "x");
    MT_DISPATCH_FLOAT(x.dtype(), op, cpu::sigmoid_fwd(x.data<scalar_t>(), y.data<scalar_t>(), x.numel()));
}

void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "sigmoid_bwd";
    if (check_same_device(op, {{"y", y}, {"dy", dy}, {"dx", dx}}) == core::Device::cuda) {
        check_arg(y, op, "y", y.ndim());
        for (const NamedArg& a : {NamedArg{"dy", dy}, NamedArg{"dx", dx}}) {
            check_arg(a.tensor, op, a.name, y.ndim());
            check_shape(a.tensor, y.shape(), op, a.name);
        }
        return cuda::sigmoid_bwd(y, dy, dx);
    }
    check_float_arg(y, op, "y", y.ndim());
    check_like(dy, y, op, "dy", "y");
    check_like(dx, y, op, "dx", "y");
    MT_DISPATCH_FLOAT(
        y.dtype(), op, cpu::sigmoid_bwd(y.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), y.numel()));
}

}  // namespace mt::ops
