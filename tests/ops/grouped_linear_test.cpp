// Cases and checks of the grouped linear op (ops/grouped_linear.h): gradients with empty experts and row counts that
// cross the linear reference's 128-row chunks, and the bitwise equality with the per-expert loop of the linear op
// (moe.md §6 test 3, CPU part).
#include "ops/grouped_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "op_harness.h"
#include "ops/linear.h"

namespace mt::ops::test {
namespace {

Tensor make_offsets(const std::vector<int32_t>& counts) {
    Tensor o = Tensor::zeros({static_cast<int64_t>(counts.size()) + 1}, DType::i32);
    int32_t acc = 0;
    for (size_t j = 0; j < counts.size(); ++j) core::tensor_set_flat(o, static_cast<int64_t>(j) + 1, acc += counts[j]);
    return o;
}

OpCase grouped_case(const std::vector<int32_t>& counts, int64_t k, int64_t m) {
    int64_t rows = 0;
    std::string tag;
    for (int32_t c : counts) {
        rows += c;
        tag += fmt::format("_{}", c);
    }
    const int64_t e = static_cast<int64_t>(counts.size());
    const std::string name = fmt::format("grouped_linear_k{}_m{}_rows{}", k, m, tag);
    return {"grouped_linear", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({rows, k}, s, 0), GradKind::written},
                            {"w", op_randn({e, m, k}, s, 1, 0.0, 1.0 / std::sqrt(k)), GradKind::accumulated},
                            {"offsets", make_offsets(counts), GradKind::none}};
                p.forward = [rows, m](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0], {rows, m});
                    grouped_linear_fwd(in[0], in[1], in[2], y);
                    return std::vector<Tensor>{y};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) {
                    grouped_linear_bwd(in[0], in[1], in[2], dout[0], grads[0], grads[1]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(grouped_case({1}, 1, 1));
    op_register(grouped_case({3, 0, 7, 1}, 5, 3));       // an empty expert
    op_register(grouped_case({0, 0, 2}, 4, 6));          // leading empty experts
    op_register(grouped_case({130, 5, 0, 61}, 17, 11));  // crosses the 128-row chunk
    // the CUDA path: many experts, empty ones, row counts off the 128-row algorithm buckets, 16-byte aligned rows
    op_register(
        op_parity_only(grouped_case({300, 0, 129, 1, 77, 0, 0, 512, 64, 255, 3, 0, 640, 7, 33, 100}, 256, 192)));
    op_register(op_parity_only(grouped_case({0, 1000, 24, 0}, 96, 200)));
    return true;
}();

// The grouped op equals a loop of linear_fwd / linear_bwd over the experts' row ranges, bitwise (f32).
TEST(GroupedLinearOp, EqualsPerExpertLoopBitwise) {
    const std::vector<int32_t> counts = {40, 0, 133, 7, 1};
    const int64_t rows = 181, k = 24, m = 19, e = 5;
    const Tensor x = op_randn({rows, k}, 3, 0).to(DType::f32), w = op_randn({e, m, k}, 3, 1, 0.0, 0.2).to(DType::f32);
    const Tensor dy = op_randn({rows, m}, 3, 2).to(DType::f32), offsets = make_offsets(counts);
    const Tensor y = Tensor::zeros({rows, m}, DType::f32), dx = op_like(x), dw = op_like(w);
    grouped_linear_fwd(x, w, offsets, y);
    grouped_linear_bwd(x, w, offsets, dy, dx, dw);
    const Tensor y2 = op_like(y), dx2 = op_like(dx), dw2 = op_like(dw);
    int64_t r0 = 0;
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r1 = r0 + counts[static_cast<size_t>(j)];
        if (r1 > r0) {
            linear_fwd(x.slice(0, r0, r1), w.select(0, j), Tensor(), y2.slice(0, r0, r1));
            linear_bwd(x.slice(0, r0, r1),
                       w.select(0, j),
                       dy.slice(0, r0, r1),
                       dx2.slice(0, r0, r1),
                       dw2.select(0, j),
                       Tensor());
        }
        r0 = r1;
    }
    EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.nbytes()), 0);
    EXPECT_EQ(std::memcmp(dx.raw(), dx2.raw(), dx.nbytes()), 0);
    EXPECT_EQ(std::memcmp(dw.raw(), dw2.raw(), dw.nbytes()), 0);
}

TEST(OpArgs, GroupedLinearShapesAndOffsets) {
    const Tensor x = Tensor::zeros({5, 4}, DType::f64), w = Tensor::zeros({2, 3, 4}, DType::f64);
    const Tensor y = Tensor::zeros({5, 3}, DType::f64);
    grouped_linear_fwd(x, w, make_offsets({2, 3}), y);
    expect_op_error(
        [&] {
            grouped_linear_fwd(x, w, make_offsets({2, 2}), y);
        },
        "grouped_linear_fwd: offsets run from 0 to 4, expected 0 to 5 (the rows of x)");
    expect_op_error(
        [&] {
            grouped_linear_fwd(x, w, make_offsets({6, -1}), y);
        },
        "grouped_linear_fwd: offsets decrease at expert 1 (6 > 5)");
    expect_op_error(
        [&] {
            grouped_linear_fwd(x, Tensor::zeros({2, 3, 5}, DType::f64), make_offsets({2, 3}), y);
        },
        "grouped_linear_fwd: w has shape [2, 3, 5], expected [2, 3, 4]");
    expect_op_error(
        [&] {
            grouped_linear_bwd(x, w, make_offsets({2, 3}), y, x, Tensor::zeros({2, 3, 4}, DType::f32));
        },
        "grouped_linear_bwd: dw has dtype f32, expected f64 (the dtype of x)");
    expect_op_error(
        [&] {
            grouped_linear_fwd(op_cuda_view({5, 4}, DType::f32), w, make_offsets({2, 3}), y);
        },
        "all tensors of one call must be on the same device");
}

}  // namespace
}  // namespace mt::ops::test
