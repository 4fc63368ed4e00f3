// Cases and argument checks of the SwiGLU gate (ops/swiglu.h).
#include "ops/swiglu.h"

#include <gtest/gtest.h>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase swiglu_case(int64_t n, int64_t f) {
    const std::string name = fmt::format("swiglu_n{}_f{}", n, f);
    return {"swiglu", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"gate", op_randn({n, f}, s, 0, 0.0, 2.0), GradKind::written},
                            {"up", op_randn({n, f}, s, 1), GradKind::written}};
                p.forward = [](const std::vector<Tensor>& in) {
                    Tensor out = op_like(in[0]);
                    swiglu_fwd(in[0], in[1], out);
                    return std::vector<Tensor>{out};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) {
                    swiglu_bwd(in[0], in[1], dout[0], grads[0], grads[1]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(swiglu_case(1, 1));
    op_register(swiglu_case(7, 5));
    op_register(swiglu_case(3, 131));
    op_register(swiglu_case(67, 101));  // more than one parallel block
    op_register(swiglu_case(300, 131));
    op_register(op_parity_only(swiglu_case(129, 1408)));  // CUDA sizes: the 8-wide vector path
    return true;
}();

TEST(OpArgs, SwigluShapesAndDtypes) {
    const Tensor g = Tensor::zeros({3, 4}, DType::f64), u = op_like(g), out = op_like(g);
    swiglu_fwd(g, u, out);
    expect_op_error(
        [&] {
            swiglu_fwd(g, Tensor::zeros({3, 5}, DType::f64), out);
        },
        "swiglu_fwd: up has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { swiglu_fwd(g, u.to(DType::f32), out); },
                    "swiglu_fwd: up has dtype f32, expected f64 (the dtype of gate)");
    expect_op_error([&] { swiglu_fwd(g.to(DType::bf16), u, out); }, "swiglu_fwd: gate has dtype bf16");
    expect_op_error(
        [&] {
            swiglu_fwd(g, u, op_noncontiguous({3, 4}, DType::f64));
        },
        "swiglu_fwd: out must be contiguous");
    swiglu_bwd(g, u, out, op_like(g), op_like(g));
    expect_op_error(
        [&] {
            swiglu_bwd(g, u, out, op_like(g), Tensor::zeros({4, 3}, DType::f64));
        },
        "swiglu_bwd: dup has shape [4, 3], expected [3, 4]");
    expect_op_error([&] { swiglu_bwd(g, u, out.to(DType::f32), op_like(g), op_like(g)); },
                    "swiglu_bwd: dout has dtype f32, expected f64 (the dtype of gate)");
    expect_op_error(
        [&] {
            swiglu_bwd(g, u, out, op_noncontiguous({3, 4}, DType::f64), op_like(g));
        },
        "swiglu_bwd: dgate must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
