// Harness cases and argument checks of the elementwise sigmoid (ops/sigmoid.h) and the sigmoid gate
// (ops/sigmoid_gate.h).
#include "ops/sigmoid.h"

#include <gtest/gtest.h>

#include "kda_inputs.h"
#include "op_harness.h"
#include "ops/sigmoid_gate.h"

namespace mt::ops::test {
namespace {

OpCase sigmoid_case(const Shape& shape) {
    const std::string name = fmt::format("sigmoid_n{}", core::shape_numel(shape));
    OpCase c{"sigmoid", name, [=] {
                 OpProblem p;
                 p.inputs = {{"x", op_randn(shape, op_seed(name), 0, 0.0, 3.0), GradKind::written}};
                 p.forward = [](const std::vector<Tensor>& in) {
                     const Tensor y = op_like(in[0]);
                     sigmoid_fwd(in[0], y);
                     return std::vector<Tensor>{y};
                 };
                 p.backward = [](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                     const Tensor y = op_like(in[0]);
                     sigmoid_fwd(in[0], y);
                     sigmoid_bwd(y, dout[0], grads[0]);
                 };
                 return p;
             }};
    op_parity_on(c, 1e-2, 1e-5, "default budgets");
    return c;
}

OpCase sigmoid_gate_case(const Shape& shape) {
    const std::string name = fmt::format("sigmoid_gate_n{}", core::shape_numel(shape));
    OpCase c{"sigmoid_gate", name, [=] {
                 const uint64_t s = op_seed(name);
                 OpProblem p;
                 p.inputs = {{"x", op_randn(shape, s, 0), GradKind::written},
                             {"z", op_randn(shape, s, 1, 0.0, 3.0), GradKind::written}};
                 p.forward = [](const std::vector<Tensor>& in) {
                     const Tensor out = op_like(in[0]);
                     sigmoid_gate_fwd(in[0], in[1], out);
                     return std::vector<Tensor>{out};
                 };
                 p.backward = [](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                     sigmoid_gate_bwd(in[0], in[1], dout[0], grads[0], grads[1]);
                 };
                 return p;
             }};
    op_parity_on(c, 1e-2, 1e-5, "default budgets");
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(sigmoid_case({1}));
    op_register(sigmoid_case({3, 7}));
    op_register(sigmoid_case({5, 9000}));  // several element blocks, OpenMP team
    op_register(sigmoid_gate_case({1}));
    op_register(sigmoid_gate_case({2, 3, 5}));
    op_register(sigmoid_gate_case({9000, 5}));
    return true;
}();

TEST(OpArgs, SigmoidShapes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), y = op_like(x);
    sigmoid_fwd(x, y);
    EXPECT_EQ(y.at({1, 1}), 0.5);
    expect_op_error(
        [&] {
            sigmoid_fwd(x, Tensor::zeros({4, 3}, DType::f32));
        },
        "sigmoid_fwd: y has shape [4, 3], expected [3, 4]");
    expect_op_error([&] { sigmoid_bwd(y, x.to(DType::f64), y); },
                    "sigmoid_bwd: dy has dtype f64, expected f32 (the dtype of y)");
    sigmoid_gate_fwd(x, x, y);
    expect_op_error(
        [&] {
            sigmoid_gate_fwd(x, Tensor::zeros({3, 5}, DType::f32), y);
        },
        "sigmoid_gate_fwd: z has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { sigmoid_gate_bwd(x, x, y, y, Tensor::zeros({12}, DType::f32)); },
                    "sigmoid_gate_bwd: dz has shape [12] (rank 1), expected rank 2");
}

}  // namespace
}  // namespace mt::ops::test
