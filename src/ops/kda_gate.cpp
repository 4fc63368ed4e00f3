// Entry points of the KDA gate: argument checks, then the CPU reference or the CUDA kernels.
#include "ops/kda_gate.h"

#include <string_view>

#include "ops/cpu/checks.h"
#include "ops/cpu/kda_kernels.h"
#include "ops/cuda/cuda_ops.h"

namespace mt::ops {

namespace {

void check_gate(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const KdaGateOptions& options, std::string_view op) {
    check_float_arg(u, op, "u", 3);
    const int64_t hv = u.size(1), k = u.size(2);
    if (options.use_a_log) {
        MT_CHECK(a_log.defined(), "{}: a_log is undefined but use_a_log is set", op);
        check_float_arg(a_log, op, "a_log", 1);
        check_shape(a_log, {hv}, op, "a_log");
        cpu::check_dtype_as(a_log, u, op, "a_log", "u");
    } else {
        MT_CHECK(!a_log.defined(), "{}: a_log is given but use_a_log is false", op);
    }
    check_float_arg(bias, op, "bias", 2);
    check_shape(bias, {hv, k}, op, "bias");
    cpu::check_dtype_as(bias, u, op, "bias", "u");
    if (options.kind == KdaGateKind::lower_bound)
        MT_CHECK(options.lower_bound >= -5.0 && options.lower_bound < 0.0,
                 "{}: lower_bound = {} is outside [-5, 0)",
                 op,
                 options.lower_bound);
}

void check_like_u(const Tensor& t, const Tensor& u, std::string_view op, const char* name) {
    check_float_arg(t, op, name, 3);
    check_shape(t, u.shape(), op, name);
    cpu::check_dtype_as(t, u, op, name, "u");
}

// Ranks, contiguity, shapes and options on any device (the CUDA path): u [N, HV, K], a_log [HV] exactly when
// use_a_log, bias [HV, K], like_u as u.
void check_gate_shapes(const Tensor& u,
                       const Tensor& a_log,
                       const Tensor& bias,
                       std::initializer_list<NamedArg> like_u,
                       const KdaGateOptions& options,
                       std::string_view op) {
    check_arg(u, op, "u", 3);
    const int64_t hv = u.size(1), k = u.size(2);
    MT_CHECK(a_log.defined() == options.use_a_log,
             "{}: a_log must be given exactly when use_a_log is set (use_a_log = {})",
             op,
             options.use_a_log);
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
    const bool lb = options.kind == KdaGateKind::lower_bound;
    if (check_same_device(op, {{"u", u}, {"a_log", a_log}, {"bias", bias}, {"g", g}}) == core::Device::cuda) {
        check_gate_shapes(u, a_log, bias, {{"g", g}}, options, op);
        return cuda::kda_gate_fwd(u, a_log, bias, g, lb, options.lower_bound);
    }
    check_gate(u, a_log, bias, options, op);
    check_like_u(g, u, op, "g");
    MT_DISPATCH_FLOAT(u.dtype(),
                      op,
                      cpu::kda_gate_fwd(u.data<scalar_t>(),
                                        a_log.defined() ? a_log.data<scalar_t>() : nullptr,
                                        bias.data<scalar_t>(),
                                        g.data<scalar_t>(),
                                        u.size(0),
                                        u.size(1),
                                        u.size(2),
                                        lb,
                                        options.lower_bound));
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
    const bool lb = options.kind == KdaGateKind::lower_bound;
    if (check_same_device(op,
                          {{"u", u},
                           {"a_log", a_log},
                           {"bias", bias},
                           {"dg", dg},
                           {"du", du},
                           {"da_log", da_log},
                           {"dbias", dbias}}) == core::Device::cuda) {
        check_gate_shapes(u, a_log, bias, {{"dg", dg}, {"du", du}}, options, op);
        MT_CHECK(da_log.defined() == a_log.defined(), "{}: da_log must be given exactly when a_log is", op);
        if (da_log.defined()) {
            check_arg(da_log, op, "da_log", 1);
            check_shape(da_log, a_log.shape(), op, "da_log");
        }
        check_arg(dbias, op, "dbias", 2);
        check_shape(dbias, bias.shape(), op, "dbias");
        return cuda::kda_gate_bwd(u, a_log, bias, dg, du, da_log, dbias, lb, options.lower_bound);
    }
    check_gate(u, a_log, bias, options, op);
    check_like_u(dg, u, op, "dg");
    check_like_u(du, u, op, "du");
    MT_CHECK(da_log.defined() == a_log.defined(), "{}: da_log must be given exactly when a_log is", op);
    if (da_log.defined()) {
        check_float_arg(da_log, op, "da_log", 1);
        check_shape(da_log, a_log.shape(), op, "da_log");
        cpu::check_dtype_as(da_log, u, op, "da_log", "u");
    }
    check_float_arg(dbias, op, "dbias", 2);
    check_shape(dbias, bias.shape(), op, "dbias");
    cpu::check_dtype_as(dbias, u, op, "dbias", "u");
    MT_DISPATCH_FLOAT(u.dtype(),
                      op,
                      cpu::kda_gate_bwd(u.data<scalar_t>(),
                                        a_log.defined() ? a_log.data<scalar_t>() : nullptr,
                                        bias.data<scalar_t>(),
                                        dg.data<scalar_t>(),
                                        du.data<scalar_t>(),
                                        da_log.defined() ? da_log.data<scalar_t>() : nullptr,
                                        dbias.data<scalar_t>(),
                                        u.size(0),
                                        u.size(1),
                                        u.size(2),
                                        lb,
                                        options.lower_bound));
}

}  // namespace mt::ops
