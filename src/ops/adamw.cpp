// Entry points of the AdamW step: argument checks and dispatch by device; the overload with a model copy writes
// the updated parameters converted to the copy's dtype (in the same kernel on CUDA, by a second pass on the CPU).
#include "ops/adamw.h"

#include <utility>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

void adamw_step(const Tensor& param,
                const Tensor& grad,
                const Tensor& m,
                const Tensor& v,
                const AdamWHyper& hyper,
                int64_t step,
                double grad_scale,
                const Tensor& param_copy,
                const AdamWRounding& rounding,
                const Tensor& update_sq,
                const Tensor& param_sq) {
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
    for (const auto& [sum, name] : {std::pair{&update_sq, "update_sq"}, std::pair{&param_sq, "param_sq"}}) {
        if (!sum->defined()) continue;
        check_arg(*sum, op, name, 1);
        check_shape(*sum, {1}, op, name);
        check_dtype_in(*sum, {DType::f64}, op, name);
    }
    MT_CHECK(step >= 1, "{}: step = {} must be >= 1 (the first step is 1)", op, step);
    MT_CHECK(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0,
             "{}: betas ({}, {}) must be in [0, 1)",
             op,
             hyper.beta1,
             hyper.beta2);
    const core::Device device = check_same_device(op,
                                                  {{"param", param},
                                                   {"grad", grad},
                                                   {"m", m},
                                                   {"v", v},
                                                   {"param_copy", param_copy},
                                                   {"update_sq", update_sq},
                                                   {"param_sq", param_sq}});
    MT_CALL_KERNEL(
        adamw_step, device, param, grad, m, v, hyper, step, grad_scale, param_copy, rounding, update_sq, param_sq);
}

}  // namespace mt::ops
