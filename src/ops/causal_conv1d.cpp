// Entry points of the causal depthwise conv: argument checks, then the CPU reference or the CUDA kernels.
#include "ops/causal_conv1d.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/cpu/kda_kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

void check_conv(const Tensor& x, const Tensor& w, std::string_view op) {
    check_float_arg(x, op, "x", 3);
    check_float_arg(w, op, "w", 2);
    MT_CHECK(w.size(0) == x.size(2),
             "{}: w has shape {} but x has {} channels; w must be [C, W]",
             op,
             core::shape_str(w.shape()),
             x.size(2));
    MT_CHECK(w.size(1) > 0, "{}: w has shape {}; the width W must be > 0", op, core::shape_str(w.shape()));
    cpu::check_dtype_as(w, x, op, "w", "x");
}

void check_like(const Tensor& t, const Tensor& ref, const Tensor& x, std::string_view op, const char* name) {
    check_float_arg(t, op, name, static_cast<int>(ref.ndim()));
    check_shape(t, ref.shape(), op, name);
    cpu::check_dtype_as(t, x, op, name, "x");
}

// Ranks, contiguity and shapes on any device (the CUDA path): x [B, T, C], w [C, W], like_x as x.
void check_conv_shapes(const Tensor& x, const Tensor& w, std::initializer_list<NamedArg> like_x, std::string_view op) {
    check_arg(x, op, "x", 3);
    check_arg(w, op, "w", 2);
    MT_CHECK(w.size(0) == x.size(2),
             "{}: w has shape {} but x has {} channels; w must be [C, W]",
             op,
             core::shape_str(w.shape()),
             x.size(2));
    MT_CHECK(w.size(1) > 0, "{}: w has shape {}; the width W must be > 0", op, core::shape_str(w.shape()));
    for (const NamedArg& a : like_x) {
        check_arg(a.tensor, op, a.name, 3);
        check_shape(a.tensor, x.shape(), op, a.name);
    }
}

}  // namespace

void causal_conv1d_fwd(const Tensor& x, const Tensor& w, const Tensor& y, bool silu) {
    constexpr std::string_view op = "causal_conv1d_fwd";
    if (check_same_device(op, {{"x", x}, {"w", w}, {"y", y}}) == core::Device::cuda) {
        check_conv_shapes(x, w, {{"y", y}}, op);
        return cuda::causal_conv1d_fwd(x, w, y, silu);
    }
    check_conv(x, w, op);
    check_like(y, x, x, op, "y");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::causal_conv1d_fwd(x.data<scalar_t>(),
                                             w.data<scalar_t>(),
                                             y.data<scalar_t>(),
                                             x.size(0),
                                             x.size(1),
                                             x.size(2),
                                             w.size(1),
                                             silu));
}

void causal_conv1d_bwd(
    const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw, bool silu) {
    constexpr std::string_view op = "causal_conv1d_bwd";
    if (check_same_device(op, {{"x", x}, {"w", w}, {"dy", dy}, {"dx", dx}, {"dw", dw}}) == core::Device::cuda) {
        check_conv_shapes(x, w, {{"dy", dy}, {"dx", dx}}, op);
        check_arg(dw, op, "dw", 2);
        check_shape(dw, w.shape(), op, "dw");
        return cuda::causal_conv1d_bwd(x, w, dy, dx, dw, silu);
    }
    check_conv(x, w, op);
    check_like(dy, x, x, op, "dy");
    check_like(dx, x, x, op, "dx");
    check_like(dw, w, x, op, "dw");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::causal_conv1d_bwd(x.data<scalar_t>(),
                                             w.data<scalar_t>(),
                                             dy.data<scalar_t>(),
                                             dx.data<scalar_t>(),
                                             dw.data<scalar_t>(),
                                             x.size(0),
                                             x.size(1),
                                             x.size(2),
                                             w.size(1),
                                             silu));
}

}  // namespace mt::ops
