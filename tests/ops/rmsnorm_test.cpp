// Cases and argument checks of RMSNorm (ops/rmsnorm.h).
#include "ops/rmsnorm.h"

#include <gtest/gtest.h>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase rmsnorm_case(int64_t n, int64_t c, double eps) {
    const std::string name = fmt::format("rmsnorm_n{}_c{}{}", n, c, eps == 0.0 ? "_eps0" : "");
    OpParityOptions parity;
    if (c == 1) {
        parity.rms_floor = 0.1;  // as OpF32's floor
        parity.floor_tensors = {"dx"};
        parity.budget_reason = "at C = 1, dx = rstd (dy w - x coef) is exactly 0 (x^2 rstd^2 = 1): rounding noise";
    }
    OpCase rc{"rmsnorm", name, [=] {
                  const uint64_t s = op_seed(name);
                  OpProblem p;
                  p.inputs = {{"x", op_randn({n, c}, s, 0), GradKind::written},
                              {"weight", op_randn({c}, s, 1, 1.0, 0.2), GradKind::accumulated}};
                  p.forward = [eps](const std::vector<Tensor>& in) {
                      Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)});
                      rmsnorm_fwd(in[0], in[1], eps, y, rstd);
                      return std::vector<Tensor>{y};
                  };
                  p.backward = [eps](const std::vector<Tensor>& in,
                                     const std::vector<Tensor>& dout,
                                     const std::vector<Tensor>& grads) {
                      Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)});
                      rmsnorm_fwd(in[0], in[1], eps, y, rstd);
                      rmsnorm_bwd(in[0], in[1], rstd, dout[0], grads[0], grads[1]);
                  };
                  return p;
              }};
    rc.parity = parity;
    if (c == 1) {
        rc.f32_rms_floor = 0.1;
        rc.f32_floor_reason = "at C = 1 the exact dx is 0: f32 returns rounding noise";
    }
    return rc;
}

// The residual stream's gradient joining in the backward (dresidual): the problem returns x itself as a second
// output, so the checks see dx = dout[1] + the norm's gradient; in_place passes dx as dresidual, as the blocks do.
OpCase rmsnorm_residual_case(int64_t n, int64_t c, bool in_place) {
    const std::string name = fmt::format("rmsnorm_residual{}_n{}_c{}", in_place ? "_in_place" : "", n, c);
    constexpr double eps = 1e-5;
    return {"rmsnorm", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, c}, s, 0), GradKind::written},
                            {"weight", op_randn({c}, s, 1, 1.0, 0.2), GradKind::accumulated}};
                p.forward = [](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)}), x = op_like(in[0]);
                    rmsnorm_fwd(in[0], in[1], eps, y, rstd);
                    x.copy_from(in[0]);
                    return std::vector<Tensor>{y, x};
                };
                p.backward = [in_place](const std::vector<Tensor>& in,
                                        const std::vector<Tensor>& dout,
                                        const std::vector<Tensor>& grads) {
                    Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)});
                    rmsnorm_fwd(in[0], in[1], eps, y, rstd);
                    if (in_place) grads[0].copy_from(dout[1]);
                    rmsnorm_bwd(in[0], in[1], rstd, dout[0], grads[0], grads[1], in_place ? grads[0] : dout[1]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(rmsnorm_residual_case(7, 5, false));
    op_register(rmsnorm_residual_case(131, 16, true));
    op_register(rmsnorm_residual_case(301, 130, true));
    op_register(op_parity_only(rmsnorm_residual_case(257, 2048, true)));
    op_register(op_parity_only(rmsnorm_residual_case(67, 2049, false)));
    op_register(rmsnorm_case(1, 1, 1e-5));
    op_register(rmsnorm_case(7, 5, 1e-5));
    op_register(rmsnorm_case(3, 257, 1e-6));
    op_register(rmsnorm_case(131, 16, 1e-5));  // more than two row blocks of the weight gradient
    op_register(rmsnorm_case(5, 8, 0.0));
    op_register(rmsnorm_case(301, 130, 1e-5));  // large enough to run on the OpenMP team
    // CUDA sizes: the 8-wide vector path over many row chunks, an odd width, and a row larger than 48 KB of f32.
    op_register(op_parity_only(rmsnorm_case(257, 2048, 1e-5)));
    op_register(op_parity_only(rmsnorm_case(67, 2049, 1e-6)));
    op_register(op_parity_only(rmsnorm_case(5, 16384, 1e-5)));
    return true;
}();

TEST(OpArgs, RmsnormShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({4}, DType::f32);
    const Tensor y = op_like(x), rstd = Tensor::zeros({3}, DType::f32);
    rmsnorm_fwd(x, w, 1e-5, y, rstd);
    expect_op_error([&] { rmsnorm_fwd(x, Tensor::zeros({3}, DType::f32), 1e-5, y, rstd); },
                    "rmsnorm_fwd: weight has shape [3], expected [4]");
    expect_op_error([&] { rmsnorm_fwd(x, w, 1e-5, y, Tensor::zeros({4}, DType::f32)); },
                    "rmsnorm_fwd: rstd has shape [4], expected [3]");
    expect_op_error([&] { rmsnorm_fwd(x.to(DType::i32), w, 1e-5, y, rstd); }, "rmsnorm_fwd: x has dtype i32");
    expect_op_error([&] { rmsnorm_fwd(x, w.to(DType::f64), 1e-5, y, rstd); },
                    "rmsnorm_fwd: weight has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            rmsnorm_fwd(op_noncontiguous({3, 4}, DType::f32), w, 1e-5, y, rstd);
        },
        "rmsnorm_fwd: x must be contiguous");
    expect_op_error([&] { rmsnorm_fwd(x, w, -1.0, y, rstd); }, "rmsnorm_fwd: eps = -1 must be >= 0");
    expect_op_error(
        [&] {
            rmsnorm_fwd(Tensor::zeros({3, 0}, DType::f32),
                        Tensor::zeros({0}, DType::f32),
                        1e-5,
                        Tensor::zeros({3, 0}, DType::f32),
                        rstd);
        },
        "rmsnorm_fwd: x has shape [3, 0]; the normalized dim C must be > 0");

    rmsnorm_bwd(x, w, rstd, y, op_like(x), op_like(w));
    expect_op_error([&] { rmsnorm_bwd(x, w, rstd, y, op_like(x), Tensor::zeros({3}, DType::f32)); },
                    "rmsnorm_bwd: dweight has shape [3], expected [4]");
    expect_op_error([&] { rmsnorm_bwd(x, w, rstd, y.to(DType::f64), op_like(x), op_like(w)); },
                    "rmsnorm_bwd: dy has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            rmsnorm_bwd(x, w, rstd, y, op_noncontiguous({3, 4}, DType::f32), op_like(w));
        },
        "rmsnorm_bwd: dx must be contiguous");
    rmsnorm_bwd(x, w, rstd, y, op_like(x), op_like(w), op_like(x));
    expect_op_error(
        [&] {
            rmsnorm_bwd(x, w, rstd, y, op_like(x), op_like(w), Tensor::zeros({3, 5}, DType::f32));
        },
        "rmsnorm_bwd: dresidual has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { rmsnorm_bwd(x, w, rstd, y, op_like(x), op_like(w), op_like(x).to(DType::f64)); },
                    "rmsnorm_bwd: dresidual has dtype f64, expected f32 (the dtype of x)");
}

}  // namespace
}  // namespace mt::ops::test
