// Entry points of the AdamW step: argument checks and dispatch by device; the overload with a model copy writes
// the updated parameters converted to the copy's dtype (in the same kernel on CUDA, by a second pass on the CPU).
#include "ops/adamw.h"

#include "ops/cpu/checks.h"
#include "ops/cpu/kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale) {
    adamw_step(param, grad, m, v, hyper, step, grad_scale, Tensor());
}

void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale,
                const Tensor& param_copy) {
    constexpr std::string_view op = "adamw_step";
    check_arg(param, op, "param", 1);
    check_arg(grad, op, "grad", 1);
    check_arg(m, op, "m", 1);
    check_arg(v, op, "v", 1);
    check_shape(grad, param.shape(), op, "grad");
    check_shape(m, param.shape(), op, "m");
    check_shape(v, param.shape(), op, "v");
    if (param_copy.defined()) {
        check_arg(param_copy, op, "param_copy", 1);
        check_shape(param_copy, param.shape(), op, "param_copy");
    }
    MT_CHECK(step >= 1, "{}: step = {} must be >= 1 (the first step is 1)", op, step);
    MT_CHECK(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0,
             "{}: betas ({}, {}) must be in [0, 1)",
             op,
             hyper.beta1,
             hyper.beta2);
    if (check_same_device(op, {{"param", param}, {"grad", grad}, {"m", m}, {"v", v}, {"param_copy", param_copy}}) ==
        core::Device::cuda)
        return cuda::adamw_step(param, grad, m, v, hyper, step, grad_scale, param_copy);
    check_float_arg(param, op, "param", 1);
    check_float_arg(grad, op, "grad", 1);
    check_float_arg(m, op, "m", 1);
    check_float_arg(v, op, "v", 1);
    cpu::check_dtype_as(grad, param, op, "grad", "param");
    cpu::check_dtype_as(m, param, op, "m", "param");
    cpu::check_dtype_as(v, param, op, "v", "param");
    if (param_copy.defined()) check_dtype_in(param_copy, {DType::bf16, DType::f32}, op, "param_copy");
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
    if (param_copy.defined()) param_copy.copy_from(param);  // converts (round to nearest even for bf16)
}

}  // namespace mt::ops
