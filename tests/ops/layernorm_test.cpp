// Cases and argument checks of LayerNorm (ops/layernorm.h).
#include "ops/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// The forward's saved statistics for in[0] (f32 on the GPU for every x dtype, x's dtype on the CPU).
struct Stats {
    Tensor mean, rstd;
};
Stats stats_for(const Tensor& x) {
    return {op_stat_like(x, {x.size(0)}), op_stat_like(x, {x.size(0)})};
}

// residual: the problem returns x itself as a second output, so the checks see dx = dout[1] + the norm's gradient;
// in_place passes dx as dresidual (holding dout[1]), as the blocks do.
OpCase layernorm_case(int64_t n, int64_t c, double eps, bool residual = false, bool in_place = false) {
    const std::string name = fmt::format("layernorm{}_n{}_c{}{}",
                                         residual ? (in_place ? "_residual_in_place" : "_residual") : "",
                                         n,
                                         c,
                                         eps == 0.0 ? "_eps0" : "");
    return {"layernorm", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, c}, s, 0, 0.3, 1.0), GradKind::written},
                            {"weight", op_randn({c}, s, 1, 1.0, 0.2), GradKind::accumulated},
                            {"bias", op_randn({c}, s, 2, 0.0, 0.5), GradKind::accumulated}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0]);
                    const Stats st = stats_for(in[0]);
                    layernorm_fwd(in[0], in[1], in[2], eps, y, st.mean, st.rstd);
                    if (!residual) return std::vector<Tensor>{y};
                    Tensor x = op_like(in[0]);
                    x.copy_from(in[0]);
                    return std::vector<Tensor>{y, x};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    Tensor y = op_like(in[0]);
                    const Stats st = stats_for(in[0]);
                    layernorm_fwd(in[0], in[1], in[2], eps, y, st.mean, st.rstd);
                    if (!residual) {
                        layernorm_bwd(in[0], in[1], st.mean, st.rstd, dout[0], grads[0], grads[1], grads[2]);
                        return;
                    }
                    if (in_place) grads[0].copy_from(dout[1]);
                    layernorm_bwd(in[0],
                                  in[1],
                                  st.mean,
                                  st.rstd,
                                  dout[0],
                                  grads[0],
                                  grads[1],
                                  grads[2],
                                  in_place ? grads[0] : dout[1]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(layernorm_case(1, 1, 1e-5));  // C = 1: y = bias, dx = 0 exactly
    op_register(layernorm_case(7, 5, 1e-5));
    op_register(layernorm_case(3, 257, 1e-6));
    op_register(layernorm_case(131, 16, 1e-5));  // more than two row blocks of the parameter gradients
    op_register(layernorm_case(5, 8, 0.0));
    op_register(layernorm_case(301, 130, 1e-6));  // large enough to run on the OpenMP team
    op_register(layernorm_case(7, 5, 1e-5, true, false));
    op_register(layernorm_case(131, 16, 1e-5, true, true));
    op_register(layernorm_case(301, 130, 1e-5, true, true));
    // CUDA sizes: the 8-wide vector path over many row chunks (the ViT's d_v = 1152 and the projector's 4 d_v), an odd
    // width, and two f32 gradient rows larger than 48 KB of shared memory.
    op_register(op_parity_only(layernorm_case(257, 1152, 1e-6)));
    op_register(op_parity_only(layernorm_case(67, 4608, 1e-6)));
    op_register(op_parity_only(layernorm_case(67, 2049, 1e-6)));
    op_register(op_parity_only(layernorm_case(5, 16384, 1e-5)));
    op_register(op_parity_only(layernorm_case(257, 1152, 1e-6, true, true)));
    return true;
}();

// The forward against the header's formula in f64, and the saved statistics.
TEST(OpLayernorm, MatchesFormula) {
    const int64_t n = 3, c = 7;
    const double eps = 1e-5;
    const Tensor x = op_randn({n, c}, 5, 0, 2.0, 3.0), w = op_randn({c}, 5, 1), b = op_randn({c}, 5, 2);
    const Tensor y = op_like(x), mean = Tensor::zeros({n}, DType::f64), rstd = Tensor::zeros({n}, DType::f64);
    layernorm_fwd(x, w, b, eps, y, mean, rstd);
    for (int64_t i = 0; i < n; ++i) {
        double mu = 0.0, var = 0.0;
        for (int64_t j = 0; j < c; ++j) mu += x.at({i, j}) / c;
        for (int64_t j = 0; j < c; ++j) var += (x.at({i, j}) - mu) * (x.at({i, j}) - mu) / c;
        EXPECT_NEAR(mean.at({i}), mu, 1e-14);
        EXPECT_NEAR(rstd.at({i}), 1.0 / std::sqrt(var + eps), 1e-12);
        for (int64_t j = 0; j < c; ++j)
            EXPECT_NEAR(y.at({i, j}), (x.at({i, j}) - mu) / std::sqrt(var + eps) * w.at({j}) + b.at({j}), 1e-12);
    }
}

TEST(OpArgs, LayernormShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({4}, DType::f32), b = op_like(w);
    const Tensor y = op_like(x), mean = Tensor::zeros({3}, DType::f32), rstd = op_like(mean);
    layernorm_fwd(x, w, b, 1e-5, y, mean, rstd);
    expect_op_error([&] { layernorm_fwd(x, Tensor::zeros({3}, DType::f32), b, 1e-5, y, mean, rstd); },
                    "layernorm_fwd: weight has shape [3], expected [4]");
    expect_op_error([&] { layernorm_fwd(x, w, Tensor::zeros({5}, DType::f32), 1e-5, y, mean, rstd); },
                    "layernorm_fwd: bias has shape [5], expected [4]");
    expect_op_error([&] { layernorm_fwd(x, w, b, 1e-5, y, Tensor::zeros({4}, DType::f32), rstd); },
                    "layernorm_fwd: mean has shape [4], expected [3]");
    expect_op_error([&] { layernorm_fwd(x, w, b, 1e-5, y, mean, Tensor::zeros({2}, DType::f32)); },
                    "layernorm_fwd: rstd has shape [2], expected [3]");
    expect_op_error([&] { layernorm_fwd(x.to(DType::i32), w, b, 1e-5, y, mean, rstd); },
                    "layernorm_fwd: x has dtype i32");
    expect_op_error([&] { layernorm_fwd(x, w, b.to(DType::f64), 1e-5, y, mean, rstd); },
                    "layernorm_fwd: bias has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            layernorm_fwd(op_noncontiguous({3, 4}, DType::f32), w, b, 1e-5, y, mean, rstd);
        },
        "layernorm_fwd: x must be contiguous");
    expect_op_error([&] { layernorm_fwd(x, w, b, -1.0, y, mean, rstd); }, "layernorm_fwd: eps = -1 must be >= 0");
    expect_op_error(
        [&] {
            layernorm_fwd(Tensor::zeros({3, 0}, DType::f32),
                          Tensor::zeros({0}, DType::f32),
                          Tensor::zeros({0}, DType::f32),
                          1e-5,
                          Tensor::zeros({3, 0}, DType::f32),
                          mean,
                          rstd);
        },
        "layernorm_fwd: x has shape [3, 0]; the normalized dim C must be > 0");
    expect_op_error([&] { layernorm_fwd(x, w, b, 1e-5, y, mean, op_cuda_view({3}, DType::f32)); },
                    "layernorm_fwd: rstd is on cuda but x is on cpu");

    layernorm_bwd(x, w, mean, rstd, y, op_like(x), op_like(w), op_like(b));
    layernorm_bwd(x, w, mean, rstd, y, op_like(x), op_like(w), op_like(b), op_like(x));
    expect_op_error([&] { layernorm_bwd(x, w, mean, rstd, y, op_like(x), op_like(w), Tensor::zeros({3}, DType::f32)); },
                    "layernorm_bwd: dbias has shape [3], expected [4]");
    expect_op_error([&] { layernorm_bwd(x, w, mean, rstd, y, op_like(x), Tensor::zeros({5}, DType::f32), op_like(b)); },
                    "layernorm_bwd: dweight has shape [5], expected [4]");
    expect_op_error([&] { layernorm_bwd(x, w, mean, rstd, y.to(DType::f64), op_like(x), op_like(w), op_like(b)); },
                    "layernorm_bwd: dy has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { layernorm_bwd(x, w, mean.to(DType::f64), rstd, y, op_like(x), op_like(w), op_like(b)); },
                    "layernorm_bwd: mean has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            layernorm_bwd(x, w, mean, rstd, y, op_noncontiguous({3, 4}, DType::f32), op_like(w), op_like(b));
        },
        "layernorm_bwd: dx must be contiguous");
    expect_op_error(
        [&] {
            layernorm_bwd(x, w, mean, rstd, y, op_like(x), op_like(w), op_like(b), Tensor::zeros({3, 5}, DType::f32));
        },
        "layernorm_bwd: dresidual has shape [3, 5], expected [3, 4]");
    expect_op_error(
        [&] { layernorm_bwd(x, w, mean, rstd, y, op_like(x), op_like(w), op_like(b), op_like(x).to(DType::f64)); },
        "layernorm_bwd: dresidual has dtype f64, expected f32 (the dtype of x)");
}

}  // namespace
}  // namespace mt::ops::test
