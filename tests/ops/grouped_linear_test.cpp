// Cases and checks of the grouped linear op (ops/grouped_linear.h): gradients with empty experts and row counts that
// cross the linear reference's 128-row chunks, and the bitwise equality with the per-expert loop of the linear op
// (moe.md §6 test 3, CPU part). The parity cases with offsets on the device run the device grouped GEMM in bf16
// (gemm/grouped_gemm_sm90.cu: 128-row tiles, 128 output columns, 64-deep steps) and cuBLASLt in f16 and f32; more
// GPU checks are in grouped_linear_gpu_test.cpp.
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

// accumulate_dx: dx accumulates (+=), and the bf16 and f16 runs keep dx and dw in the input's dtype (a half-precision
// dx must be, and it tests the device kernel's bf16 dw). tag: the name's row-count part (long lists are summarised).
OpCase grouped_case(
    const std::vector<int32_t>& counts, int64_t k, int64_t m, bool accumulate_dx = false, std::string tag = {}) {
    int64_t rows = 0;
    const bool list = tag.empty();
    for (int32_t c : counts) {
        rows += c;
        if (list) tag += fmt::format("_{}", c);
    }
    const int64_t e = static_cast<int64_t>(counts.size());
    const std::string name =
        fmt::format("grouped_linear_k{}_m{}_rows{}{}", k, m, tag, accumulate_dx ? "_accumulate_dx" : "");
    OpCase c = {"grouped_linear", name, [=] {
                    const uint64_t s = op_seed(name);
                    OpProblem p;
                    p.inputs = {
                        {"x", op_randn({rows, k}, s, 0), accumulate_dx ? GradKind::accumulated : GradKind::written},
                        {"w", op_randn({e, m, k}, s, 1, 0.0, 1.0 / std::sqrt(k)), GradKind::accumulated},
                        {"offsets", make_offsets(counts), GradKind::none}};
                    p.forward = [rows, m](const std::vector<Tensor>& in) {
                        Tensor y = op_like(in[0], {rows, m});
                        grouped_linear_fwd(in[0], in[1], in[2], y);
                        return std::vector<Tensor>{y};
                    };
                    p.backward = [accumulate_dx](const std::vector<Tensor>& in,
                                                 const std::vector<Tensor>& dout,
                                                 const std::vector<Tensor>& grads) {
                        grouped_linear_bwd(in[0], in[1], in[2], dout[0], grads[0], grads[1], accumulate_dx);
                    };
                    return p;
                }};
    c.parity.accumulated_grad_in_input_dtype = accumulate_dx;
    return c;
}

// E row counts drawn from {0, 1, 2, 3, 5, 7, 11, 13, 61, 127, 128, 129, 131, 257}, seeded: empty experts, single rows,
// primes and counts on either side of the device kernel's 128-row tiles, in varying order.
std::vector<int32_t> mixed_counts(int64_t e, uint64_t seed) {
    static const int32_t kCounts[] = {0, 1, 2, 3, 5, 7, 11, 13, 61, 127, 128, 129, 131, 257};
    const Tensor pick = op_rand_ids({e}, seed, 0, 0, 14);
    std::vector<int32_t> counts;
    for (int64_t j = 0; j < e; ++j) counts.push_back(kCounts[pick.data<int32_t>()[j]]);
    return counts;
}

// E experts with all rows in expert `at`.
std::vector<int32_t> one_expert(int64_t e, int64_t at, int32_t rows) {
    std::vector<int32_t> counts(static_cast<size_t>(e), 0);
    counts[static_cast<size_t>(at)] = rows;
    return counts;
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
    // The device kernel (bf16): E in {1, 3, 64, 257}, K and M in {64, 72, 256, 1536} (72: a partial 64-deep step and
    // a partial 128-column tile), dx written and accumulated, dw f32 and bf16.
    op_register(grouped_case({37}, 8, 16));  // the smallest shapes it takes, through every CPU mode too
    op_register(grouped_case({3, 0, 2}, 16, 8, /*accumulate_dx=*/true));
    op_register(op_parity_only(grouped_case({300}, 64, 64)));
    op_register(op_parity_only(grouped_case({1}, 72, 1536)));
    op_register(op_parity_only(grouped_case({0, 131, 1}, 72, 256)));
    op_register(op_parity_only(grouped_case({129, 0, 257}, 1536, 72, true)));
    op_register(op_parity_only(grouped_case({257, 128, 0}, 1536, 1536)));
    op_register(op_parity_only(grouped_case(mixed_counts(64, 1), 256, 72, false, "_mixed64")));
    op_register(op_parity_only(grouped_case(mixed_counts(64, 2), 72, 256, true, "_mixed64")));
    op_register(op_parity_only(grouped_case(one_expert(64, 17, 1009), 1536, 64, false, "_one_of_64")));
    op_register(op_parity_only(grouped_case(mixed_counts(257, 3), 64, 1536, false, "_mixed257")));
    op_register(op_parity_only(grouped_case(mixed_counts(257, 4), 1536, 256, true, "_mixed257")));
    op_register(op_parity_only(grouped_case(one_expert(257, 256, 389), 256, 256, true, "_last_of_257")));
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

// accumulate_dw false writes dw over NaN: the bits of the sum into zeros, and zeros for the empty experts.
TEST(GroupedLinearOp, WrittenDwEqualsTheSumIntoZeros) {
    const std::vector<int32_t> counts = {40, 0, 133, 7, 0};
    const int64_t rows = 180, k = 24, m = 19, e = 5;
    const Tensor x = op_randn({rows, k}, 4, 0).to(DType::f32), w = op_randn({e, m, k}, 4, 1, 0.0, 0.2).to(DType::f32);
    const Tensor dy = op_randn({rows, m}, 4, 2).to(DType::f32), offsets = make_offsets(counts);
    const Tensor added = Tensor::zeros(w.shape(), DType::f32), written = Tensor::zeros(w.shape(), DType::f32);
    written.fill(std::nan(""));
    grouped_linear_bwd(x, w, offsets, dy, Tensor(), added);
    grouped_linear_bwd(x, w, offsets, dy, Tensor(), written, false, GroupedGemm::automatic, /*accumulate_dw=*/false);
    EXPECT_EQ(std::memcmp(added.raw(), written.raw(), added.nbytes()), 0);
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

// The MoE layer may run dx and dw apart (moe.grouped_gemm = "auto": dx on the device kernel, dw on cuBLASLt): a
// dx-only call and a dw-only call give the joint call's bytes, and a call with neither is an error.
TEST(OpArgs, GroupedLinearDxAndDwApart) {
    const std::vector<int32_t> counts = {3, 0, 4};
    const Tensor x = op_randn({7, 5}, 11, 0), w = op_randn({3, 6, 5}, 11, 1), dy = op_randn({7, 6}, 11, 2);
    const Tensor offsets = make_offsets(counts);
    const Tensor dx = Tensor::zeros({7, 5}, x.dtype()), dw = op_randn({3, 6, 5}, 11, 3);
    const Tensor dx_apart = Tensor::zeros({7, 5}, x.dtype()), dw_apart = dw.clone();
    grouped_linear_bwd(x, w, offsets, dy, dx, dw, false);
    grouped_linear_bwd(x, w, offsets, dy, dx_apart, Tensor(), false);
    grouped_linear_bwd(x, w, offsets, dy, Tensor(), dw_apart, false);
    EXPECT_TRUE(op_same_bytes(dx, dx_apart));
    EXPECT_TRUE(op_same_bytes(dw, dw_apart));
    expect_op_error([&] { grouped_linear_bwd(x, w, offsets, dy, Tensor(), Tensor(), false); },
                    "grouped_linear_bwd: dx and dw are both undefined (nothing to compute)");
}

}  // namespace
}  // namespace mt::ops::test
