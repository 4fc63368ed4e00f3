// Entry points of Muon's step and of Newton-Schulz: argument checks and dispatch by device.
#include "ops/muon.h"

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {
void check_hyper(const MuonHyper& h, std::string_view op) {
    MT_CHECK(h.total_steps() >= 1 && h.total_steps() <= 100, "{}: {} Newton-Schulz steps", op, h.total_steps());
}

// update_sq [1] or [E] f64, param_copy [E, A, B] of a forward dtype (muon_step's and muon_apply's).
void check_outputs(const Tensor& param, const Tensor& update_sq, const Tensor& param_copy, std::string_view op) {
    if (update_sq.defined()) {
        check_arg(update_sq, op, "update_sq", 1);
        if (update_sq.size(0) != 1) check_shape(update_sq, {param.size(0)}, op, "update_sq");
        check_dtype_in(update_sq, {core::DType::f64}, op, "update_sq");
    }
    if (param_copy.defined()) {
        check_arg(param_copy, op, "param_copy", 3);
        check_shape(param_copy, param.shape(), op, "param_copy");
        check_dtype_in(param_copy, {core::DType::bf16, core::DType::f16, core::DType::f32}, op, "param_copy");
    }
}
}  // namespace

void muon_step(const Tensor& param,
               const Tensor& grad,
               const Tensor& m,
               const MuonHyper& hyper,
               double grad_scale,
               const Tensor& update_sq,
               const Tensor& param_copy,
               const Tensor& n_norm) {
    constexpr std::string_view op = "muon_step";
    check_arg(param, op, "param", 3);
    check_arg(grad, op, "grad", 3);
    check_arg(m, op, "m", 3);
    check_shape(grad, param.shape(), op, "grad");
    check_shape(m, param.shape(), op, "m");
    check_hyper(hyper, op);
    check_outputs(param, update_sq, param_copy, op);
    if (n_norm.defined()) {
        check_arg(n_norm, op, "n_norm", 1);
        check_shape(n_norm, {param.size(0)}, op, "n_norm");
        check_dtype_in(n_norm, {core::DType::f64}, op, "n_norm");
    }
    const core::Device device = check_same_device(op,
                                                  {{"param", param},
                                                   {"grad", grad},
                                                   {"m", m},
                                                   {"update_sq", update_sq},
                                                   {"param_copy", param_copy},
                                                   {"n_norm", n_norm}});
    MT_CALL_KERNEL(muon_step, device, param, grad, m, hyper, grad_scale, update_sq, param_copy, n_norm);
}

void muon_momentum(const Tensor& grad, const Tensor& m, const Tensor& n, const MuonHyper& hyper, double grad_scale) {
    constexpr std::string_view op = "muon_momentum";
    check_arg(grad, op, "grad", 3);
    check_arg(m, op, "m", 3);
    check_arg(n, op, "n", 3);
    check_shape(m, grad.shape(), op, "m");
    check_shape(n, grad.shape(), op, "n");
    check_dtype_as(n, m, op, "n", "m");
    const core::Device device = check_same_device(op, {{"grad", grad}, {"m", m}, {"n", n}});
    MT_CALL_KERNEL(muon_momentum, device, grad, m, n, hyper, grad_scale);
}

void muon_apply(const Tensor& param,
                const Tensor& o,
                double decay,
                double step,
                const Tensor& update_sq,
                const Tensor& param_copy) {
    constexpr std::string_view op = "muon_apply";
    check_arg(param, op, "param", 3);
    check_arg(o, op, "o", 3);
    check_shape(o, param.shape(), op, "o");
    check_outputs(param, update_sq, param_copy, op);
    const core::Device device =
        check_same_device(op, {{"param", param}, {"o", o}, {"update_sq", update_sq}, {"param_copy", param_copy}});
    MT_CALL_KERNEL(muon_apply, device, param, o, decay, step, update_sq, param_copy);
}

void newton_schulz(const Tensor& x, const Tensor& out, const MuonHyper& hyper) {
    constexpr std::string_view op = "newton_schulz";
    check_arg(x, op, "x", 3);
    check_arg(out, op, "out", 3);
    check_shape(out, x.shape(), op, "out");
    check_hyper(hyper, op);
    const core::Device device = check_same_device(op, {{"x", x}, {"out", out}});
    MT_CALL_KERNEL(newton_schulz, device, x, out, hyper);
}

}  // namespace mt::ops
