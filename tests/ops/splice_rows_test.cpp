// Cases and argument checks of splice_rows (ops/splice_rows.h). The harness case takes (base, src) and returns
// y = base with src spliced in (a copy, so that base is an ordinary input): d_base = dy with the spliced rows zeroed,
// d_src = the gathered rows of dy, which is what splice_rows_bwd leaves in dx and dsrc.
#include "ops/splice_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// m distinct rows of [0, n) in a seeded scattered order (the first m of a random permutation).
Tensor splice_index(int64_t n, int64_t m, uint64_t seed) {
    const Tensor keys = op_uniform({n}, seed, 7, 0.0, 1.0);
    const double* k = keys.data<double>();
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return k[a] < k[b]; });
    Tensor index = Tensor::zeros({m}, DType::i32);
    std::copy(order.begin(), order.begin() + m, index.data<int32_t>());
    return index;
}

OpCase splice_rows_case(int64_t n, int64_t m, int64_t c) {
    const std::string name = fmt::format("splice_rows_n{}_m{}_c{}", n, m, c);
    OpCase oc{"splice_rows", name, [=] {
                  const uint64_t s = op_seed(name);
                  OpProblem pr;
                  pr.inputs = {{"base", op_randn({n, c}, s, 0), GradKind::written},
                               {"src", op_randn({m, c}, s, 1), m > 0 ? GradKind::written : GradKind::none},
                               {"index", splice_index(n, m, s), GradKind::none}};
                  pr.forward = [](const std::vector<Tensor>& in) {
                      Tensor y = op_like(in[0]);
                      y.copy_from(in[0]);
                      splice_rows_fwd(in[1], in[2], y);
                      return std::vector<Tensor>{y};
                  };
                  pr.backward = [=](const std::vector<Tensor>& in,
                                    const std::vector<Tensor>& dout,
                                    const std::vector<Tensor>& grads) {
                      grads[0].copy_from(dout[0]);
                      splice_rows_bwd(in[2], grads[0], m > 0 ? grads[1] : op_like(in[1]));
                  };
                  return pr;
              }};
    // A copy: the CUDA side must equal the CPU reference bit for bit in every dtype.
    oc.parity.bf16_budget = 0.0;
    oc.parity.f32_budget = 0.0;
    oc.parity.budget_reason = "a row copy (and zeroing): bitwise equal";
    return oc;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(splice_rows_case(1, 0, 3));  // M = 0: nothing spliced, d_base = dy
    op_register(splice_rows_case(1, 1, 1));  // every row replaced
    op_register(splice_rows_case(7, 1, 5));
    op_register(splice_rows_case(13, 5, 7));   // scattered, unsorted rows
    op_register(splice_rows_case(11, 11, 3));  // M = N in a permuted order
    op_register(splice_rows_case(97, 43, 33));
    op_register(splice_rows_case(400, 144, 96));  // large enough to run on the OpenMP team
    // CUDA sizes: d_model 2048 (16-byte words), an odd width (2-byte words in bf16), one 336x336 image in a sequence.
    op_register(op_parity_only(splice_rows_case(1031, 576, 2048)));
    op_register(op_parity_only(splice_rows_case(509, 144, 1151)));
    return true;
}();

// The forward against the header: x[index[i]] = src[i], other rows untouched; the backward gathers then zeroes.
TEST(OpSpliceRows, MatchesDefinition) {
    const int64_t n = 9, m = 4, c = 3;
    const Tensor base = op_randn({n, c}, 51, 0).to(DType::f32), src = op_randn({m, c}, 51, 1).to(DType::f32);
    Tensor index = Tensor::zeros({m}, DType::i32);
    const std::vector<int32_t> rows = {6, 0, 8, 3};
    std::copy(rows.begin(), rows.end(), index.data<int32_t>());
    const Tensor x = base.clone();
    splice_rows_fwd(src, index, x);
    for (int64_t r = 0; r < n; ++r) {
        const auto it = std::find(rows.begin(), rows.end(), r);
        for (int64_t j = 0; j < c; ++j)
            ASSERT_EQ(x.at({r, j}), it == rows.end() ? base.at({r, j}) : src.at({it - rows.begin(), j}));
    }
    const Tensor dx = x.clone(), dsrc = op_like(src);
    dsrc.fill(std::nan(""));
    splice_rows_bwd(index, dx, dsrc);
    EXPECT_TRUE(op_same_bytes(dsrc, src));
    for (int64_t r = 0; r < n; ++r) {
        const bool spliced = std::find(rows.begin(), rows.end(), r) != rows.end();
        for (int64_t j = 0; j < c; ++j) ASSERT_EQ(dx.at({r, j}), spliced ? 0.0 : base.at({r, j}));
    }
}

TEST(OpArgs, SpliceRowsShapesAndDtypes) {
    const Tensor x = Tensor::zeros({6, 3}, DType::f32), src = Tensor::zeros({2, 3}, DType::f32);
    const auto ids = [](std::vector<int32_t> v) {
        Tensor t = Tensor::zeros({static_cast<int64_t>(v.size())}, DType::i32);
        std::copy(v.begin(), v.end(), t.data<int32_t>());
        return t;
    };
    const Tensor index = ids({4, 1});
    splice_rows_fwd(src, index, x);
    splice_rows_bwd(index, x, op_like(src));
    splice_rows_fwd(Tensor::zeros({0, 3}, DType::f32), ids({}), x);
    expect_op_error(
        [&] {
            splice_rows_fwd(src, ids({4, 4}), x);
        },
        "splice_rows_fwd: index[0] = index[1] = 4; the entries must be distinct");
    expect_op_error(
        [&] {
            splice_rows_bwd(ids({2, 2}), x, op_like(src));
        },
        "splice_rows_bwd: index[0] = index[1] = 2; the entries must be distinct");
    expect_op_error([&] { splice_rows_fwd(src, ids({1, 6}), x); }, "splice_rows_fwd: index[1] = 6 is outside [0, 6)");
    expect_op_error([&] { splice_rows_fwd(src, ids({-1, 0}), x); }, "splice_rows_fwd: index[0] = -1 is outside [0, 6)");
    expect_op_error([&] { splice_rows_fwd(src, index.to(DType::i64), x); },
                    "splice_rows_fwd: index has dtype i64, expected i32");
    expect_op_error(
        [&] {
            splice_rows_fwd(src, ids({1, 2, 3}), x);
        },
        "splice_rows_fwd: src has shape [2, 3], expected [3, 3]");
    expect_op_error(
        [&] {
            splice_rows_fwd(Tensor::zeros({2, 4}, DType::f32), index, x);
        },
        "splice_rows_fwd: src has shape [2, 4], expected [2, 3]");
    expect_op_error([&] { splice_rows_fwd(src.to(DType::f64), index, x); },
                    "splice_rows_fwd: src has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { splice_rows_fwd(src.to(DType::i32), index, x.to(DType::i32)); },
                    "splice_rows_fwd: x has dtype i32");
    expect_op_error([&] { splice_rows_bwd(index, x, op_like(src).to(DType::f64)); },
                    "splice_rows_bwd: dsrc has dtype f64, expected f32 (the dtype of dx)");
    expect_op_error(
        [&] {
            splice_rows_fwd(src, index, op_noncontiguous({6, 3}, DType::f32));
        },
        "splice_rows_fwd: x must be contiguous");
    expect_op_error([&] { splice_rows_fwd(src, op_cuda_view({2}, DType::i32), x); },
                    "splice_rows_fwd: index is on the cuda but x is on the cpu");
    expect_op_error(
        [&] {
            splice_rows_fwd(op_cuda_view({2, 3}, DType::f32), index, x);
        },
        "splice_rows_fwd: src is on cuda but x is on cpu");
    expect_op_error([&] { splice_rows_fwd(x.slice(0, 0, 2), index, x); }, "splice_rows_fwd: src must not alias x");
}

}  // namespace
}  // namespace mt::ops::test
