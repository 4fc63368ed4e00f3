// Cases and argument checks of the residual add (ops/add.h), including out aliasing a or b.
#include "ops/add.h"

#include <gtest/gtest.h>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

enum class Alias { none, a, b };

OpCase add_case(const Shape& shape, Alias alias) {
    const std::string name = fmt::format("add_{}{}",
                                         fmt::join(shape, "x"),
                                         alias == Alias::a   ? "_out_is_a"
                                         : alias == Alias::b ? "_out_is_b"
                                                             : "");
    return {"add", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"a", op_randn(shape, s, 0), GradKind::accumulated},
                            {"b", op_randn(shape, s, 1), GradKind::accumulated}};
                p.forward = [alias](const std::vector<Tensor>& in) {
                    if (alias == Alias::none) {
                        Tensor out = op_like(in[0]);
                        add_fwd(in[0], in[1], out);
                        return std::vector<Tensor>{out};
                    }
                    // out = a + b written over a copy of a (or b): the residual stream updated in place.
                    Tensor a = in[0].clone(), b = in[1].clone();
                    Tensor out = alias == Alias::a ? a : b;
                    add_fwd(a, b, out);
                    return std::vector<Tensor>{out};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) { add_bwd(dout[0], grads[0], grads[1]); };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(add_case({1}, Alias::none));
    op_register(add_case({7, 5}, Alias::none));
    op_register(add_case({2, 3, 5}, Alias::a));
    op_register(add_case({2, 3, 5}, Alias::b));
    op_register(add_case({4, 10007}, Alias::none));                    // several parallel blocks, on the OpenMP team
    op_register(op_parity_only(add_case({4, 512, 64}, Alias::none)));  // CUDA sizes: the 8-wide vector path
    op_register(op_parity_only(add_case({4, 512, 64}, Alias::a)));
    return true;
}();

TEST(OpArgs, AddShapesAndDtypes) {
    const Tensor a = Tensor::zeros({2, 3}, DType::f32), b = op_like(a), out = op_like(a);
    add_fwd(a, b, out);
    expect_op_error(
        [&] {
            add_fwd(a, Tensor::zeros({3, 2}, DType::f32), out);
        },
        "add_fwd: b has shape [3, 2], expected [2, 3]");
    expect_op_error([&] { add_fwd(a, Tensor::zeros({6}, DType::f32), out); },
                    "add_fwd: b has shape [6] (rank 1), expected rank 2");
    expect_op_error([&] { add_fwd(a, b.to(DType::f64), out); },
                    "add_fwd: b has dtype f64, expected f32 (the dtype of a)");
    expect_op_error([&] { add_fwd(a.to(DType::i32), b, out); }, "add_fwd: a has dtype i32");
    expect_op_error([&] { add_fwd(a, b, op_noncontiguous({2, 3}, DType::f32)); }, "add_fwd: out must be contiguous");
    add_bwd(out, a, b);
    expect_op_error(
        [&] {
            add_bwd(out, a, Tensor::zeros({2, 4}, DType::f32));
        },
        "add_bwd: db has shape [2, 4], expected [2, 3]");
    expect_op_error([&] { add_bwd(out, a.to(DType::f64), b); },
                    "add_bwd: da has dtype f64, expected f32 (the dtype of dout)");
    expect_op_error([&] { add_bwd(out, op_noncontiguous({2, 3}, DType::f32), b); }, "add_bwd: da must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
