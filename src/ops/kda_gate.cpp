// Entry points of the KDA gate: argument checks, then the CPU reference or the CUDA kernels.
#include "ops/kda_gate.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// Ranks, contiguity, shapes and options on any device: u [N, HV, K], a_log [HV] exactly when
// use_a_log, bias [HV, K], like_u as u.
void check_gate_shapes(const Tensor& u,
                       const Tensor& a_log,
                       const Tensor& bias,
                       std::initializer_list<NamedArg> like_u,
                       const KdaGateOptions& options,
                       std::string_view op) {
    check_arg(u, op, "u", 3);
    const int64_t hv = u.size(1), k = u.size(2);
    if (options.use_a_log)
        MT_CHECK(a_log.defined(), "{}: a_log is undefined but use_a_log is set", op);
    else
        MT_CHECK(!a_log.defined(), "{}: a_log is given but use_a_log is false", op);
    if (a_log.defined()) {
        check_arg(a_log, op, "a_log", 1);
        check_shape(a_log, {hv}, op, "a_log");
    }
    check_arg(bias, op, "bias", 2);
    check_shape(bias, {hv, k}, op, "bias");
    if (options.kind == KdaGateKind::lower_bound)
        MT_CHECK(options.lower_bound >= -5.0 && options.lower_bound < 0.0,
                 "{}: lower_bound = {} is outside [-5, 0)",
                 op,
                 options.lower_bound);
    for (const NamedArg& a : like_u) {
        check_arg(a.tensor, op, a.name, 3);
        check_shape(a.tensor, u.shape(), op, a.name);
    }
}

}  // namespace

void kda_gate_fwd(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const Tensor& g, const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_fwd";
    const core::Device device = check_same_device(op, {{"u", u}, {"a_log", a_log}, {"bias", bias}, {"g", g}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_gate_shapes(u, a_log, bias, {{"g", g}}, options, op);
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(kda_gate_fwd, core::Device::cuda, u, a_log, bias, g, options);
    }
    MT_CALL_KERNEL(kda_gate_fwd, core::Device::cpu, u, a_log, bias, g, options);
}

void kda_gate_bwd(const Tensor& u,
                  const Tensor& a_log,
                  const Tensor& bias,
                  const Tensor& dg,
                  const Tensor& du,
                  const Tensor& da_log,
                  const Tensor& dbias,
                  const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_bwd";
    const core::Device device = check_same_device(
        op, {{"u", u}, {"a_log", a_log}, {"bias", bias}, {"dg", dg}, {"du", du}, {"da_log", da_log}, {"dbias", dbias}});
    // Shapes on every device (the CPU kernel checks its dtypes).
    check_gate_shapes(u, a_log, bias, {{"dg", dg}, {"du", du}}, options, op);
    MT_CHECK(da_log.defined() == a_log.defined(), "{}: da_log must be given exactly when a_log is", op);
    if (da_log.defined()) {
        check_arg(da_log, op, "da_log", 1);
        check_shape(da_log, a_log.shape(), op, "da_log");
    }
    check_arg(dbias, op, "dbias", 2);
    check_shape(dbias, bias.shape(), op, "dbias");
    if (device == core::Device::cuda) {
        return MT_CALL_KERNEL(kda_gate_bwd, core::Device::cuda, u, a_log, bias, dg, du, da_log, dbias, options);
    }
    MT_CALL_KERNEL(kda_gate_bwd, core::Device::cpu, u, a_log, bias, dg, du, da_log, dbias, options);
}

}  // namespace mt::ops
