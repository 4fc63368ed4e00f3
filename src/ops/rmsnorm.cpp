// Entry points of the RMSNorm op: argument checks and dispatch by device.
#include "ops/rmsnorm.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void rmsnorm_fwd(const Tensor& x,
                 const Tensor& weight,
                 double eps,
                 const Tensor& y,
                 const Tensor& rstd,
                 const Tensor& residual,
                 const Tensor& sum) {
    constexpr std::string_view op = "rmsnorm_fwd";
    check_arg(x, op, "x", 2);
    check_arg(weight, op, "weight", 1);
    check_arg(y, op, "y", 2);
    check_arg(rstd, op, "rstd", 1);
    const int64_t n = x.size(0), c = x.size(1);
    MT_CHECK(c > 0, "{}: x has shape {}; the normalized dim C must be > 0", op, core::shape_str(x.shape()));
    check_shape(weight, {c}, op, "weight");
    check_shape(y, {n, c}, op, "y");
    check_shape(rstd, {n}, op, "rstd");
    MT_CHECK(eps >= 0.0, "{}: eps = {} must be >= 0", op, eps);
    MT_CHECK(residual.defined() == sum.defined(),
             "{}: residual and sum go together (the fused add writes x + residual to sum); {} is missing",
             op,
             residual.defined() ? "sum" : "residual");
    if (residual.defined()) {
        check_arg(residual, op, "residual", 2);
        check_arg(sum, op, "sum", 2);
        check_shape(residual, {n, c}, op, "residual");
        check_shape(sum, {n, c}, op, "sum");
        check_dtype_as(residual, x, op, "residual", "x");
        check_dtype_as(sum, x, op, "sum", "x");
    }
    const core::Device device = check_same_device(
        op, {{"x", x}, {"weight", weight}, {"y", y}, {"rstd", rstd}, {"residual", residual}, {"sum", sum}});
    MT_CALL_KERNEL(rmsnorm_fwd, device, x, weight, eps, y, rstd, residual, sum);
}

void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight,
                 const Tensor& dresidual) {
    constexpr std::string_view op = "rmsnorm_bwd";
    check_arg(x, op, "x", 2);
    check_arg(weight, op, "weight", 1);
    check_arg(rstd, op, "rstd", 1);
    check_arg(dy, op, "dy", 2);
    check_arg(dx, op, "dx", 2);
    check_arg(dweight, op, "dweight", 1);
    const int64_t n = x.size(0), c = x.size(1);
    check_shape(weight, {c}, op, "weight");
    check_shape(rstd, {n}, op, "rstd");
    check_shape(dy, {n, c}, op, "dy");
    check_shape(dx, {n, c}, op, "dx");
    check_shape(dweight, {c}, op, "dweight");
    if (dresidual.defined()) {
        check_arg(dresidual, op, "dresidual", 2);
        check_shape(dresidual, {n, c}, op, "dresidual");
    }
    const core::Device device = check_same_device(op,
                                                  {{"x", x},
                                                   {"weight", weight},
                                                   {"rstd", rstd},
                                                   {"dy", dy},
                                                   {"dx", dx},
                                                   {"dweight", dweight},
                                                   {"dresidual", dresidual}});
    MT_CALL_KERNEL(rmsnorm_bwd, device, x, weight, rstd, dy, dx, dweight, dresidual);
}

}  // namespace mt::ops
