// Cases and argument checks of the linear op (ops/linear.h).
#include "ops/linear.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase linear_case(int64_t n, int64_t k, int64_t m, bool bias) {
    const std::string name = fmt::format("linear_n{}_k{}_m{}{}", n, k, m, bias ? "_bias" : "");
    return {"linear", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, k}, s, 0), GradKind::written},
                            {"w", op_randn({m, k}, s, 1, 0.0, 1.0 / std::sqrt(k)), GradKind::accumulated}};
                if (bias) p.inputs.push_back({"bias", op_randn({m}, s, 2), GradKind::accumulated});
                p.forward = [bias](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0], {in[0].size(0), in[1].size(0)});
                    linear_fwd(in[0], in[1], bias ? in[2] : Tensor(), y);
                    return std::vector<Tensor>{y};
                };
                p.backward = [bias](const std::vector<Tensor>& in,
                                    const std::vector<Tensor>& dout,
                                    const std::vector<Tensor>& grads) {
                    linear_bwd(in[0], in[1], dout[0], grads[0], grads[1], bias ? grads[2] : Tensor());
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(linear_case(1, 1, 1, false));
    op_register(linear_case(1, 1, 1, true));
    op_register(linear_case(7, 5, 3, true));
    op_register(linear_case(13, 17, 11, false));
    op_register(linear_case(131, 33, 37, true));  // crosses the 128-row chunk of the forward and of dx
    op_register(linear_case(5, 263, 259, true));  // crosses the 256 x 256 tiles of dw
    return true;
}();

TEST(OpArgs, LinearShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({5, 4}, DType::f32);
    const Tensor y = Tensor::zeros({3, 5}, DType::f32), b = Tensor::zeros({5}, DType::f32);
    linear_fwd(x, w, b, y);  // the valid call
    expect_op_error(
        [&] {
            linear_fwd(x, Tensor::zeros({5, 3}, DType::f32), b, y);
        },
        "linear_fwd: w has shape [5, 3], expected [5, 4]");
    expect_op_error(
        [&] {
            linear_fwd(x, w, b, Tensor::zeros({3, 4}, DType::f32));
        },
        "linear_fwd: y has shape [3, 4], expected [3, 5]");
    expect_op_error([&] { linear_fwd(x, w, Tensor::zeros({4}, DType::f32), y); }, "linear_fwd: bias has shape [4]");
    expect_op_error(
        [&] {
            linear_fwd(Tensor::zeros({3, 4, 1}, DType::f32), w, b, y);
        },
        "linear_fwd: x has shape [3, 4, 1] (rank 3), expected rank 2");
    expect_op_error([&] { linear_fwd(x.to(DType::bf16), w, b, y); }, "linear_fwd: x has dtype bf16, expected f32");
    expect_op_error([&] { linear_fwd(x, w.to(DType::f64), b, y); },
                    "linear_fwd: w has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { linear_fwd(x, w, b.to(DType::f64), y); }, "linear_fwd: bias has dtype f64");
    expect_op_error(
        [&] {
            linear_fwd(op_noncontiguous({3, 4}, DType::f32), w, b, y);
        },
        "linear_fwd: x must be contiguous");
    expect_op_error([&] { linear_fwd(x, Tensor(), b, y); }, "linear_fwd: w is undefined");
    expect_op_error(
        [&] {
            linear_fwd(op_cuda_view({3, 4}, DType::f32), w, b, y);
        },
        "linear_fwd: x is a cuda tensor; linear_fwd is not implemented on cuda yet");

    const Tensor dw = Tensor::zeros({5, 4}, DType::f32);
    linear_bwd(x, w, y, x.clone(), dw, b.clone());
    expect_op_error(
        [&] {
            linear_bwd(x, w, Tensor::zeros({3, 4}, DType::f32), x, dw, b);
        },
        "linear_bwd: dy has shape [3, 4], expected [3, 5]");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, Tensor::zeros({4, 4}, DType::f32), dw, b);
        },
        "linear_bwd: dx has shape [4, 4], expected [3, 4]");
    expect_op_error([&] { linear_bwd(x, w, y, x, dw.to(DType::f64), b); }, "linear_bwd: dw has dtype f64");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, x, op_noncontiguous({5, 4}, DType::f32), b);
        },
        "linear_bwd: dw must be contiguous");
    expect_op_error([&] { linear_bwd(x, w, y, x, Tensor(), b); }, "linear_bwd: dw is undefined");
}

// dx undefined skips the input gradient; dbias undefined skips the bias gradient; dw still accumulates.
TEST(OpLinear, BackwardSkipsUndefinedGradients) {
    const uint64_t s = op_seed("OpLinear.BackwardSkipsUndefinedGradients");
    const Tensor x = op_randn({6, 5}, s, 0), w = op_randn({4, 5}, s, 1), dy = op_randn({6, 4}, s, 2);
    const Tensor dx = op_like(x), dw = op_like(w), dbias = Tensor::zeros({4}, DType::f64);
    linear_bwd(x, w, dy, dx, dw, dbias);
    const Tensor dw2 = op_like(w);
    linear_bwd(x, w, dy, Tensor(), dw2, Tensor());
    EXPECT_EQ(op_rho(dw2, dw), 0.0);
    linear_bwd(x, w, dy, Tensor(), dw2, Tensor());  // accumulates: now twice the gradient
    for (int64_t i = 0; i < dw.numel(); ++i)
        EXPECT_DOUBLE_EQ(core::tensor_get_flat(dw2, i), 2 * core::tensor_get_flat(dw, i));
}

// An empty batch (N = 0) is a no-op that leaves the accumulated gradients alone; K = 0 gives y = bias.
TEST(OpLinear, EmptySizes) {
    const Tensor w = op_randn({3, 4}, 1, 0), dw = op_randn({3, 4}, 1, 1), dw0 = dw.clone();
    const Tensor x = Tensor::zeros({0, 4}, DType::f64), y = Tensor::zeros({0, 3}, DType::f64);
    linear_fwd(x, w, Tensor(), y);
    linear_bwd(x, w, y, op_like(x), dw, Tensor());
    EXPECT_EQ(op_rho(dw, dw0), 0.0);
    const Tensor x0 = Tensor::zeros({2, 0}, DType::f64), w0 = Tensor::zeros({3, 0}, DType::f64);
    const Tensor bias = op_randn({3}, 1, 2), y0 = Tensor::zeros({2, 3}, DType::f64);
    linear_fwd(x0, w0, bias, y0);
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(y0.at({i, j}), bias.at({j}));
}

}  // namespace
}  // namespace mt::ops::test
