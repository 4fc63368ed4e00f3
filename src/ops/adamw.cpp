// Entry point of the AdamW step: argument checks and CPU dispatch.
#include "ops/adamw.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"

namespace mt::ops {

void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale) {
    constexpr std::string_view op = "adamw_step";
    check_float_arg(param, op, "param", 1);
    check_float_arg(grad, op, "grad", 1);
    check_float_arg(m, op, "m", 1);
    check_float_arg(v, op, "v", 1);
    cpu::check_dtype_as(grad, param, op, "grad", "param");
    cpu::check_dtype_as(m, param, op, "m", "param");
    cpu::check_dtype_as(v, param, op, "v", "param");
    check_shape(grad, param.shape(), op, "grad");
    check_shape(m, param.shape(), op, "m");
    check_shape(v, param.shape(), op, "v");
    MT_CHECK(step >= 1, "{}: step = {} must be >= 1 (the first step is 1)", op, step);
    MT_CHECK(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0,
             "{}: betas ({}, {}) must be in [0, 1)",
             op,
             hyper.beta1,
             hyper.beta2);
    MT_DISPATCH_FLOAT(param.dtype(),
                      op,
                      cpu::adamw_step(param.data<scalar_t>(),
                                      grad.data<scalar_t>(),
                                      m.data<scalar_t>(),
                                      v.data<scalar_t>(),
                                      param.numel(),
                                      hyper.lr,
                                      hyper.beta1,
                                      hyper.beta2,
                                      hyper.eps,
                                      hyper.weight_decay,
                                      step,
                                      grad_scale));
}

}  // namespace mt::ops
