// Entry points of the row L2 norm: argument checks, then the CPU reference or the CUDA kernel (rinv f32 there).
#include "ops/l2norm.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// Ranks, contiguity and shapes on any device: x [N, C], rinv [N], the rest like x.
void check_l2_shapes(const Tensor& x, const Tensor& rinv, std::initializer_list<NamedArg> like_x, std::string_view op) {
    check_arg(x, op, "x", 2);
    MT_CHECK(x.size(1) > 0, "{}: x has shape {}; the normalized dim C must be > 0", op, core::shape_str(x.shape()));
    check_arg(rinv, op, "rinv", 1);
    check_shape(rinv, {x.size(0)}, op, "rinv");
    for (const NamedArg& a : like_x) {
        check_arg(a.tensor, op, a.name, 2);
        check_shape(a.tensor, x.shape(), op, a.name);
    }
}

}  // namespace

void l2norm_fwd(const Tensor& x, double scale, double eps, const Tensor& y, const Tensor& rinv) {
    constexpr std::string_view op = "l2norm_fwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"y", y}, {"rinv", rinv}});
    MT_CHECK(eps > 0.0, "{}: eps = {} must be > 0", op, eps);
    check_l2_shapes(x, rinv, {{"y", y}}, op);  // shapes on every device (the CPU kernel checks its dtypes)
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(l2norm_fwd, core::Device::cuda, x, scale, eps, y, rinv);
    }
    MT_CALL_KERNEL(l2norm_fwd, core::Device::cpu, x, scale, eps, y, rinv);
}

void l2norm_bwd(const Tensor& x, const Tensor& rinv, double scale, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "l2norm_bwd";
    const core::Device device = check_same_device(op, {{"x", x}, {"rinv", rinv}, {"dy", dy}, {"dx", dx}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_l2_shapes(x, rinv, {{"dy", dy}, {"dx", dx}}, op);
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(l2norm_bwd, core::Device::cuda, x, rinv, scale, dy, dx);
    }
    MT_CALL_KERNEL(l2norm_bwd, core::Device::cpu, x, rinv, scale, dy, dx);
}

}  // namespace mt::ops
