// Harness cases and argument checks of the row L2 norm (ops/l2norm.h).
#include "ops/l2norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kda_inputs.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase l2_case(int64_t n, int64_t c, double scale, double eps) {
    const std::string name = fmt::format("l2norm_n{}_c{}_s{}", n, c, scale == 1.0 ? "1" : "k");
    OpCase oc{"l2norm", name, [=] {
                  OpProblem p;
                  p.inputs = {{"x", op_randn({n, c}, op_seed(name), 0), GradKind::written}};
                  p.forward = [=](const std::vector<Tensor>& in) {
                      const Tensor y = op_like(in[0]), rinv = op_stat_like(in[0], {n});
                      l2norm_fwd(in[0], scale, eps, y, rinv);
                      return std::vector<Tensor>{y};
                  };
                  p.backward = [=](const std::vector<Tensor>& in,
                                   const std::vector<Tensor>& dout,
                                   const std::vector<Tensor>& grads) {
                      const Tensor y = op_like(in[0]), rinv = op_stat_like(in[0], {n});
                      l2norm_fwd(in[0], scale, eps, y, rinv);
                      l2norm_bwd(in[0], rinv, scale, dout[0], grads[0]);
                  };
                  return p;
              }};
    op_parity_on(oc, 1e-2, 1e-5, "default budgets");
    if (c == 1) {
        // A one-element row normalises to +-scale whatever x is, so the exact dx is O(eps / x^2) and both sides return
        // the rounding noise of dy - xh (xh . dy): judged against 0.1 rms, as OpF32 does.
        oc.parity.rms_floor = 0.1;
        oc.parity.floor_tensors = {"dx"};
        oc.f32_rms_floor = 0.1;
        oc.f32_floor_reason =
            "C = 1: the exact dx is O(eps / x^2), f32 returns the rounding noise of dy - xh (xh . dy)";
        oc.parity.budget_reason = "default budgets; rms floor 0.1 for C = 1 (exact dx is O(eps / x^2))";
    }
    return oc;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(l2_case(1, 1, 1.0, 1e-6));
    op_register(l2_case(7, 5, 1.0, 1e-6));
    op_register(l2_case(13, 16, 0.25, 1e-6));  // q: scale K^-1/2
    op_register(l2_case(700, 64, 1.0, 1e-6));  // large enough for the OpenMP team
    return true;
}();

TEST(OpCheck, L2normUnitRows) {
    const Tensor x = op_randn({5, 7}, 3, 0), y = op_like(x), rinv = op_like(x, {5});
    l2norm_fwd(x, 2.0, 1e-6, y, rinv);
    for (int64_t r = 0; r < 5; ++r) {
        double ss = 0, xs = 0;
        for (int64_t i = 0; i < 7; ++i) {
            ss += y.at({r, i}) * y.at({r, i});
            xs += x.at({r, i}) * x.at({r, i});
        }
        EXPECT_NEAR(std::sqrt(ss), 2.0 * std::sqrt(xs / (xs + 1e-6)), 1e-14);
        EXPECT_NEAR(rinv.at({r}), 1.0 / std::sqrt(xs + 1e-6), 1e-14);
    }
}

TEST(OpArgs, L2normShapes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), y = op_like(x), rinv = Tensor::zeros({3}, DType::f32);
    l2norm_fwd(x, 1.0, 1e-6, y, rinv);
    expect_op_error([&] { l2norm_fwd(x, 1.0, 1e-6, y, Tensor::zeros({4}, DType::f32)); },
                    "l2norm_fwd: rinv has shape [4], expected [3]");
    expect_op_error([&] { l2norm_fwd(x, 1.0, 0.0, y, rinv); }, "l2norm_fwd: eps = 0 must be > 0");
    expect_op_error(
        [&] {
            l2norm_bwd(x, rinv, 1.0, y, Tensor::zeros({3, 5}, DType::f32));
        },
        "l2norm_bwd: dx has shape [3, 5], expected [3, 4]");
}

}  // namespace
}  // namespace mt::ops::test
