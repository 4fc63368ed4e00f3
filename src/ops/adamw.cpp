// Entry points of the AdamW step: argument checks and dispatch by device; the overload with a model copy writes
// the updated parameters converted to the copy's dtype (in the same kernel on CUDA, by a second pass on the CPU).
#include "ops/adamw.h"

#include <fmt/format.h>

#include <utility>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// The step counter and the betas, for both entry points.
void check_step(std::string_view op, const AdamWHyper& hyper, int64_t step) {
    MT_CHECK(step >= 1, "{}: step = {} must be >= 1 (the first step is 1)", op, step);
    MT_CHECK(hyper.beta1 >= 0.0 && hyper.beta1 < 1.0 && hyper.beta2 >= 0.0 && hyper.beta2 < 1.0,
             "{}: betas ({}, {}) must be in [0, 1)",
             op,
             hyper.beta1,
             hyper.beta2);
}

// One update's tensors, for both entry points: flat and contiguous, grad, m, v (and the copy) of param's shape, the
// optional squared-sum outputs [1] f64 each, all on one device, which is returned.
core::Device check_tensors(std::string_view op,
                           const Tensor& param,
                           const Tensor& grad,
                           const Tensor& m,
                           const Tensor& v,
                           const Tensor& param_copy,
                           const Tensor& update_sq,
                           const Tensor& param_sq) {
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
    return check_same_device(op,
                             {{"param", param},
                              {"grad", grad},
                              {"m", m},
                              {"v", v},
                              {"param_copy", param_copy},
                              {"update_sq", update_sq},
                              {"param_sq", param_sq}});
}

}  // namespace

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
    const core::Device device = check_tensors(op, param, grad, m, v, param_copy, update_sq, param_sq);
    check_step(op, hyper, step);
    MT_CALL_KERNEL(
        adamw_step, device, param, grad, m, v, hyper, step, grad_scale, param_copy, rounding, update_sq, param_sq);
}

void adamw_step_list(const std::vector<AdamWPiece>& pieces, const AdamWHyper& hyper, int64_t step, double grad_scale) {
    constexpr std::string_view op = "adamw_step_list";
    if (pieces.empty()) return;
    const AdamWPiece& first = pieces.front();
    const core::Device device = first.param.device();
    for (size_t i = 0; i < pieces.size(); ++i) {
        const AdamWPiece& p = pieces[i];
        const std::string at = fmt::format("{} (piece {})", op, i);
        check_tensors(at, p.param, p.grad, p.m, p.v, p.param_copy, p.update_sq, p.param_sq);
        // One dtype of each argument for the whole list (the CUDA launch is compiled for one combination).
        check_dtype_as(p.param, first.param, at, "param", "piece 0's param");
        check_dtype_as(p.grad, first.grad, at, "grad", "piece 0's grad");
        check_dtype_as(p.m, first.m, at, "m", "piece 0's m");
        check_dtype_as(p.v, first.m, at, "v", "piece 0's m");
        MT_CHECK(p.param_copy.defined() == first.param_copy.defined(),
                 "{}: param_copy {} but piece 0's {}: every piece has a copy or none does",
                 at,
                 p.param_copy.defined() ? "given" : "missing",
                 first.param_copy.defined() ? "given" : "missing");
        if (p.param_copy.defined()) check_dtype_as(p.param_copy, first.param_copy, at, "param_copy", "piece 0's");
        check_same_device(at, {{"piece 0's param", first.param}, {"param", p.param}});
    }
    check_step(op, hyper, step);
    MT_CALL_KERNEL(adamw_step_list, device, pieces, hyper, step, grad_scale);
}

}  // namespace mt::ops
