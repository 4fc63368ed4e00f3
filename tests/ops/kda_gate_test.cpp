// Harness cases and argument checks of the KDA gate (ops/kda_gate.h): the lower-bounded gate at several bounds,
// with and without A_log, and the unbounded softplus gate; plus the ranges each gate can reach.
#include "ops/kda_gate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kda_inputs.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase gate_case(int64_t n, int64_t hv, int64_t k, KdaGateOptions options) {
    const std::string name =
        fmt::format("kda_gate_n{}_hv{}_k{}_{}{}{}",
                    n,
                    hv,
                    k,
                    options.kind == KdaGateKind::softplus ? "softplus" : "bound",
                    options.kind == KdaGateKind::softplus ? 0 : static_cast<int>(-10 * options.lower_bound),
                    options.use_a_log ? "" : "_noalog");
    OpCase c{"kda_gate", name, [=] {
                 const uint64_t s = op_seed(name);
                 OpProblem p;
                 p.inputs = {{"u", op_randn({n, hv, k}, s, 0, 0.0, 2.0), GradKind::written},
                             {"bias", op_randn({hv, k}, s, 1, -1.0, 1.0), GradKind::accumulated}};
                 if (options.use_a_log)
                     p.inputs.push_back({"a_log", op_randn({hv}, s, 2, 0.5, 0.7), GradKind::accumulated});
                 p.forward = [=](const std::vector<Tensor>& in) {
                     const Tensor g = op_like(in[0]);
                     kda_gate_fwd(in[0], options.use_a_log ? in[2] : Tensor(), in[1], g, options);
                     return std::vector<Tensor>{g};
                 };
                 p.backward = [=](const std::vector<Tensor>& in,
                                  const std::vector<Tensor>& dout,
                                  const std::vector<Tensor>& grads) {
                     kda_gate_bwd(in[0],
                                  options.use_a_log ? in[2] : Tensor(),
                                  in[1],
                                  dout[0],
                                  grads[0],
                                  options.use_a_log ? grads[2] : Tensor(),
                                  grads[1],
                                  options);
                 };
                 return p;
             }};
    op_parity_on(c, 1e-2, 1e-5, "default budgets");
    if (n * hv * k == 1) {
        // One element, whose gate sits near saturation: the exact dbias and da_log carry the factor s (1 - s), which
        // f32 forms from a rounded s with a few digits only (relative 2.7e-3 against f64); judged on 0.1 rms.
        c.f32_rms_floor = 0.1;
        c.f32_floor_reason = "a single gate element near saturation: s (1 - s) in f32 keeps few digits";
    }
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(gate_case(1, 1, 1, {}));
    op_register(gate_case(7, 3, 5, {}));
    op_register(gate_case(13, 2, 4, {KdaGateKind::lower_bound, -1.5, false}));
    op_register(gate_case(11, 3, 6, {KdaGateKind::softplus, -5.0, true}));
    op_register(gate_case(5, 2, 3, {KdaGateKind::softplus, -5.0, false}));
    op_register(gate_case(300, 4, 32, {}));  // large enough for the OpenMP team
    return true;
}();

// The bounded gate stays inside (l, 0) for any input; the softplus gate reaches far below -5.
TEST(OpCheck, KdaGateRanges) {
    const Tensor u = op_uniform({64, 2, 8}, 3, 0, -60.0, 60.0), bias = Tensor::zeros({2, 8}, DType::f64);
    const Tensor a_log = Tensor::zeros({2}, DType::f64), g = op_like(u);
    a_log.fill(std::log(16.0));
    kda_gate_fwd(u, a_log, bias, g, {KdaGateKind::lower_bound, -5.0, true});
    double lo = 0, hi = -10;
    for (int64_t i = 0; i < g.numel(); ++i) {
        lo = std::min(lo, core::tensor_get_flat(g, i));
        hi = std::max(hi, core::tensor_get_flat(g, i));
    }
    EXPECT_GE(lo, -5.0);
    EXPECT_LE(hi, 0.0);
    kda_gate_fwd(u, a_log, bias, g, {KdaGateKind::softplus, -5.0, true});
    lo = 0;
    for (int64_t i = 0; i < g.numel(); ++i) lo = std::min(lo, core::tensor_get_flat(g, i));
    EXPECT_LT(lo, -500.0);  // -16 * softplus(60)
}

TEST(OpArgs, KdaGateShapesAndOptions) {
    const Tensor u = Tensor::zeros({4, 2, 3}, DType::f32), bias = Tensor::zeros({2, 3}, DType::f32);
    const Tensor a_log = Tensor::zeros({2}, DType::f32), g = op_like(u);
    kda_gate_fwd(u, a_log, bias, g);
    expect_op_error(
        [&] {
            kda_gate_fwd(u, a_log, bias, g, {KdaGateKind::lower_bound, -6.0, true});
        },
        "kda_gate_fwd: lower_bound = -6 is outside [-5, 0)");
    expect_op_error(
        [&] {
            kda_gate_fwd(u, a_log, bias, g, {KdaGateKind::lower_bound, 0.0, true});
        },
        "kda_gate_fwd: lower_bound = 0 is outside [-5, 0)");
    expect_op_error([&] { kda_gate_fwd(u, Tensor::zeros({3}, DType::f32), bias, g); },
                    "kda_gate_fwd: a_log has shape [3], expected [2]");
    expect_op_error([&] { kda_gate_fwd(u, Tensor(), bias, g); },
                    "kda_gate_fwd: a_log is undefined but use_a_log is set");
    expect_op_error(
        [&] {
            kda_gate_fwd(u, a_log, bias, g, {KdaGateKind::lower_bound, -5.0, false});
        },
        "kda_gate_fwd: a_log is given but use_a_log is false");
    expect_op_error(
        [&] {
            kda_gate_fwd(u, a_log, Tensor::zeros({3, 2}, DType::f32), g);
        },
        "kda_gate_fwd: bias has shape [3, 2], expected [2, 3]");
    expect_op_error([&] { kda_gate_fwd(u, a_log, bias.to(DType::f64), g); },
                    "kda_gate_fwd: bias has dtype f64, expected f32 (the dtype of u)");
    expect_op_error(
        [&] {
            kda_gate_fwd(op_cuda_view({4, 2, 3}, DType::f32), a_log, bias, g);
        },
        "kda_gate_fwd: a_log is on cpu but u is on cuda; all tensors of one call must be on the same device");
    const Tensor du = op_like(u), da = op_like(a_log), db = op_like(bias);
    kda_gate_bwd(u, a_log, bias, g, du, da, db);
    expect_op_error([&] { kda_gate_bwd(u, a_log, bias, g, du, Tensor(), db); },
                    "kda_gate_bwd: da_log must be given exactly when a_log is");
}

}  // namespace
}  // namespace mt::ops::test
