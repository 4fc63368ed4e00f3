// Cases and argument checks of rotary position embedding (ops/rope.h), including the in-place forms.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// in_place: the forward runs with y aliasing x, and the backward with dx aliasing dy.
OpCase rope_case(int64_t b, int64_t t, int64_t h, int64_t d, double theta, int64_t pos_offset, bool in_place) {
    const std::string name =
        fmt::format("rope_b{}_t{}_h{}_d{}_pos{}{}", b, t, h, d, pos_offset, in_place ? "_inplace" : "");
    return {"rope", name, [=] {
                OpProblem p;
                p.inputs = {{"x", op_randn({b, t, h, d}, op_seed(name), 0), GradKind::written}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0]);
                    if (in_place) {
                        y.copy_from(in[0]);
                        rope_fwd(y, theta, pos_offset, y);
                    } else {
                        rope_fwd(in[0], theta, pos_offset, y);
                    }
                    return std::vector<Tensor>{y};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    if (in_place) {
                        grads[0].copy_from(dout[0]);
                        rope_bwd(grads[0], theta, pos_offset, grads[0]);
                    } else {
                        rope_bwd(dout[0], theta, pos_offset, grads[0]);
                    }
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(rope_case(1, 1, 1, 2, 10000.0, 0, false));
    op_register(rope_case(2, 5, 3, 6, 10000.0, 0, false));
    op_register(rope_case(1, 7, 2, 16, 500000.0, 3, false));
    op_register(rope_case(2, 5, 3, 6, 10000.0, 0, true));
    op_register(rope_case(3, 37, 2, 10, 10000.0, 11, true));
    op_register(rope_case(4, 67, 4, 32, 10000.0, 0, false));  // large enough to run on the OpenMP team
    // CUDA sizes: the 8-wide vector path with long positions (angles computed in f64, as the CPU does).
    op_register(op_parity_only(rope_case(2, 1024, 4, 128, 10000.0, 0, false)));
    op_register(op_parity_only(rope_case(1, 300, 3, 64, 500000.0, 4000, true)));
    return true;
}();

// The rotation itself, against the formula in the header at one (t, i).
TEST(OpRope, MatchesFormula) {
    const int64_t t = 5, d = 8, pos = 2;
    const double theta = 10000.0;
    const Tensor x = op_randn({1, t, 1, d}, 7, 0), y = op_like(x);
    rope_fwd(x, theta, pos, y);
    for (int64_t tt = 0; tt < t; ++tt) {
        for (int64_t i = 0; i < d / 2; ++i) {
            const double angle = static_cast<double>(pos + tt) * std::pow(theta, -2.0 * i / d);
            const double lo = x.at({0, tt, 0, i}), hi = x.at({0, tt, 0, i + d / 2});
            EXPECT_NEAR(y.at({0, tt, 0, i}), lo * std::cos(angle) - hi * std::sin(angle), 1e-14);
            EXPECT_NEAR(y.at({0, tt, 0, i + d / 2}), hi * std::cos(angle) + lo * std::sin(angle), 1e-14);
        }
    }
}

TEST(OpArgs, RopeShapesAndDtypes) {
    const Tensor x = Tensor::zeros({1, 2, 3, 4}, DType::f32), y = op_like(x);
    rope_fwd(x, 10000.0, 0, y);
    expect_op_error(
        [&] {
            rope_fwd(x, 10000.0, 0, Tensor::zeros({1, 2, 3, 6}, DType::f32));
        },
        "rope_fwd: y has shape [1, 2, 3, 6], expected [1, 2, 3, 4]");
    expect_op_error(
        [&] {
            rope_fwd(Tensor::zeros({1, 2, 3, 5}, DType::f32), 10000.0, 0, Tensor::zeros({1, 2, 3, 5}, DType::f32));
        },
        "rope_fwd: x has shape [1, 2, 3, 5]; the head dim D must be even");
    expect_op_error(
        [&] {
            rope_fwd(Tensor::zeros({2, 3, 4}, DType::f32), 10000.0, 0, y);
        },
        "rope_fwd: x has shape [2, 3, 4] (rank 3), expected rank 4");
    expect_op_error([&] { rope_fwd(x.to(DType::f16), 10000.0, 0, y); }, "rope_fwd: x has dtype f16");
    expect_op_error([&] { rope_fwd(x, 10000.0, 0, y.to(DType::f64)); },
                    "rope_fwd: y has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            rope_fwd(op_noncontiguous({1, 2, 3, 4}, DType::f32), 10000.0, 0, y);
        },
        "rope_fwd: x must be contiguous");
    expect_op_error([&] { rope_fwd(x, 0.0, 0, y); }, "rope_fwd: theta = 0 must be > 0");
    expect_op_error([&] { rope_fwd(x, 10000.0, -1, y); }, "rope_fwd: pos_offset = -1 must be >= 0");
    expect_op_error(
        [&] {
            rope_bwd(y, 10000.0, 0, Tensor::zeros({1, 2, 3, 2}, DType::f32));
        },
        "rope_bwd: dx has shape [1, 2, 3, 2], expected [1, 2, 3, 4]");
    expect_op_error(
        [&] {
            rope_bwd(y, 10000.0, 0, op_noncontiguous({1, 2, 3, 4}, DType::f32));
        },
        "rope_bwd: dx must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
