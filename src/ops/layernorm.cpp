// Entry points of the LayerNorm op: argument checks and dispatch by device.
#include "ops/layernorm.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void layernorm_fwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& bias,
                   double eps,
                   const Tensor& y,
                   const Tensor& mean,
                   const Tensor& rstd) {
    constexpr std::string_view op = "layernorm_fwd";
    check_arg(x, op, "x", 2);
    check_arg(weight, op, "weight", 1);
    check_arg(bias, op, "bias", 1);
    check_arg(y, op, "y", 2);
    check_arg(mean, op, "mean", 1);
    check_arg(rstd, op, "rstd", 1);
    const int64_t n = x.size(0), c = x.size(1);
    MT_CHECK(c > 0, "{}: x has shape {}; the normalized dim C must be > 0", op, core::shape_str(x.shape()));
    check_shape(weight, {c}, op, "weight");
    check_shape(bias, {c}, op, "bias");
    check_shape(y, {n, c}, op, "y");
    check_shape(mean, {n}, op, "mean");
    check_shape(rstd, {n}, op, "rstd");
    MT_CHECK(eps >= 0.0, "{}: eps = {} must be >= 0", op, eps);
    const core::Device device =
        check_same_device(op, {{"x", x}, {"weight", weight}, {"bias", bias}, {"y", y}, {"mean", mean}, {"rstd", rstd}});
    MT_CALL_KERNEL(layernorm_fwd, device, x, weight, bias, eps, y, mean, rstd);
}

void layernorm_bwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& mean,
                   const Tensor& rstd,
                   const Tensor& dy,
                   const Tensor& dx,
                   const Tensor& dweight,
                   const Tensor& dbias,
                   const Tensor& dresidual) {
    constexpr std::string_view op = "layernorm_bwd";
    check_arg(x, op, "x", 2);
    check_arg(weight, op, "weight", 1);
    check_arg(mean, op, "mean", 1);
    check_arg(rstd, op, "rstd", 1);
    check_arg(dy, op, "dy", 2);
    check_arg(dx, op, "dx", 2);
    check_arg(dweight, op, "dweight", 1);
    check_arg(dbias, op, "dbias", 1);
    const int64_t n = x.size(0), c = x.size(1);
    MT_CHECK(c > 0, "{}: x has shape {}; the normalized dim C must be > 0", op, core::shape_str(x.shape()));
    check_shape(weight, {c}, op, "weight");
    check_shape(mean, {n}, op, "mean");
    check_shape(rstd, {n}, op, "rstd");
    check_shape(dy, {n, c}, op, "dy");
    check_shape(dx, {n, c}, op, "dx");
    check_shape(dweight, {c}, op, "dweight");
    check_shape(dbias, {c}, op, "dbias");
    if (dresidual.defined()) {
        check_arg(dresidual, op, "dresidual", 2);
        check_shape(dresidual, {n, c}, op, "dresidual");
    }
    const core::Device device = check_same_device(op,
                                                  {{"x", x},
                                                   {"weight", weight},
                                                   {"mean", mean},
                                                   {"rstd", rstd},
                                                   {"dy", dy},
                                                   {"dx", dx},
                                                   {"dweight", dweight},
                                                   {"dbias", dbias},
                                                   {"dresidual", dresidual}});
    MT_CALL_KERNEL(layernorm_bwd, device, x, weight, mean, rstd, dy, dx, dweight, dbias, dresidual);
}

}  // namespace mt::ops
