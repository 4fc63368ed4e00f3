// Cases and argument checks of the exact GELU (ops/gelu.h), including the in-place forms.
#include "ops/gelu.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// in_place: the forward runs with y aliasing x, and the backward with dx aliasing dy.
OpCase gelu_case(const Shape& shape, bool in_place) {
    std::string dims;
    for (int64_t d : shape) dims += fmt::format("_{}", d);
    const std::string name = fmt::format("gelu{}{}", dims, in_place ? "_inplace" : "");
    return {"gelu", name, [=] {
                OpProblem p;
                p.inputs = {{"x", op_randn(shape, op_seed(name), 0, 0.0, 2.0), GradKind::written}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0]);
                    if (in_place) {
                        y.copy_from(in[0]);
                        gelu_fwd(y, y);
                    } else {
                        gelu_fwd(in[0], y);
                    }
                    return std::vector<Tensor>{y};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    if (in_place) {
                        grads[0].copy_from(dout[0]);
                        gelu_bwd(in[0], grads[0], grads[0]);
                    } else {
                        gelu_bwd(in[0], dout[0], grads[0]);
                    }
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(gelu_case({1}, false));
    op_register(gelu_case({7, 5}, false));
    op_register(gelu_case({3, 4, 11}, true));
    op_register(gelu_case({2, 3, 5, 7}, false));
    op_register(gelu_case({40009}, false));  // large enough to run on the OpenMP team
    op_register(gelu_case({131, 257}, true));
    // CUDA sizes: the 8-wide vector path (the ViT MLP's 4304 and the projector's 4608 columns) and an odd length.
    op_register(op_parity_only(gelu_case({257, 4304}, false)));
    op_register(op_parity_only(gelu_case({64, 4608}, true)));
    op_register(op_parity_only(gelu_case({(1 << 20) + 3}, false)));
    return true;
}();

// The formula at a few points in f64, against hand-computed values of x Phi(x) (Phi from std::erfc, which is
// accurate in the tails where 1 + erf cancels).
TEST(OpGelu, MatchesFormula) {
    const std::vector<double> xs = {-6.0, -3.0, -1.0, -0.5, 0.0, 1e-3, 0.5, 1.0, 3.0, 6.0};
    Tensor x = Tensor::zeros({static_cast<int64_t>(xs.size())}, DType::f64);
    for (size_t i = 0; i < xs.size(); ++i) x.data<double>()[i] = xs[i];
    const Tensor y = op_like(x), dx = op_like(x);
    Tensor dy = op_like(x);
    dy.fill(1.0);
    gelu_fwd(x, y);
    gelu_bwd(x, dy, dx);
    for (size_t i = 0; i < xs.size(); ++i) {
        const double v = xs[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
        const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
        EXPECT_NEAR(y.data<double>()[i], v * cdf, 1e-15 + 1e-14 * std::fabs(v * cdf)) << v;
        EXPECT_NEAR(dx.data<double>()[i], cdf + v * pdf, 1e-15) << v;
    }
    EXPECT_NEAR(y.data<double>()[7], 0.8413447460685429, 1e-15);  // GELU(1) = Phi(1)
}

TEST(OpArgs, GeluShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), y = op_like(x);
    gelu_fwd(x, y);
    gelu_bwd(x, y, op_like(x));
    expect_op_error(
        [&] {
            gelu_fwd(x, Tensor::zeros({4, 3}, DType::f32));
        },
        "gelu_fwd: y has shape [4, 3], expected [3, 4]");
    expect_op_error([&] { gelu_fwd(x, Tensor::zeros({12}, DType::f32)); },
                    "gelu_fwd: y has shape [12] (rank 1), expected rank 2");
    expect_op_error([&] { gelu_fwd(x.to(DType::i32), y); }, "gelu_fwd: x has dtype i32");
    expect_op_error([&] { gelu_fwd(x, y.to(DType::f64)); }, "gelu_fwd: y has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { gelu_fwd(op_noncontiguous({3, 4}, DType::f32), y); }, "gelu_fwd: x must be contiguous");
    expect_op_error([&] { gelu_fwd(x, op_cuda_view({3, 4}, DType::f32)); }, "gelu_fwd: y is on cuda but x is on cpu");
    expect_op_error(
        [&] {
            gelu_bwd(x, Tensor::zeros({3, 5}, DType::f32), op_like(x));
        },
        "gelu_bwd: dy has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { gelu_bwd(x, y, op_like(x).to(DType::f64)); },
                    "gelu_bwd: dx has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { gelu_bwd(x, y, op_noncontiguous({3, 4}, DType::f32)); }, "gelu_bwd: dx must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
