// Attention of queries over a key prefix (ops/attention.h, Tk > T: the queries are the last T of the Tk positions),
// the building block of sequence segments and context-parallel chunks (long_context.md §4, §7): the prefix call gives
// the last rows of full attention over the Tk positions, and its dk, dv are those rows' share of the full gradient
// (f64, rho <= 1e-12), with a document map and a window; two segments run in order (the second over the first's keys)
// reproduce one pass, outputs and every gradient. The CUDA kernels' prefix parity is attention_prefix_gpu_test.cpp.
#include <gtest/gtest.h>

#include "ops/attention.h"
#include "ops/op_harness.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

constexpr int64_t kB = 2, kTk = 77, kHq = 4, kHkv = 2, kD = 6;

struct Grads {
    Tensor out, lse, dq, dk, dv;
};

// Forward and backward of q [B, T] over k, v [B, Tk] with the mask.
Grads run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionMask& mask) {
    Grads g{
        op_like(q), Tensor::zeros({q.size(0), q.size(2), q.size(1)}, DType::f64), op_like(q), op_like(k), op_like(v)};
    attention_fwd(q, k, v, g.out, g.lse, {}, mask);
    attention_bwd(q, k, v, g.out, g.lse, dout, g.dq, g.dk, g.dv, {}, mask);
    return g;
}

// Rows [first, end) of x [B, T, ...] (a copy), and of lse [B, H, T] along its last axis.
Tensor rows(const Tensor& x, int64_t first, int64_t end) {
    return x.slice(1, first, end).clone();
}
Tensor lse_rows(const Tensor& lse, int64_t first, int64_t end) {
    return lse.slice(2, first, end).clone();
}

std::vector<AttentionMask> masks() {
    const Tensor docs = mt::testing::doc_start_map({{0, 20, 21, 50}, {0}}, kTk);
    return {{}, {.doc_start = docs}, {.window = 9}, {.doc_start = docs, .window = 13}};
}

TEST(AttentionKeyPrefix, EqualsTheLastRowsOfFullAttention) {
    const Tensor q = op_randn({kB, kTk, kHq, kD}, 31, 0), k = op_randn({kB, kTk, kHkv, kD}, 31, 1);
    const Tensor v = op_randn({kB, kTk, kHkv, kD}, 31, 2), dout = op_randn({kB, kTk, kHq, kD}, 31, 3);
    int checked = 0;
    for (const AttentionMask& mask : masks())
        for (int64_t t : {int64_t{1}, int64_t{30}, kTk}) {
            SCOPED_TRACE(::testing::Message()
                         << "T " << t << " window " << mask.window << " docs " << mask.doc_start.defined());
            const int64_t first = kTk - t;
            // The full pass with the gradient only on the last t rows: its dk, dv are those rows' share.
            Tensor dout_tail = dout.clone();
            const int64_t row = kHq * kD;  // elements per position
            for (int64_t i = 0; i < dout_tail.numel(); ++i)
                if ((i / row) % kTk < first) core::tensor_set_flat(dout_tail, i, 0.0);
            const Grads full = run(q, k, v, dout_tail, mask);
            const Grads part = run(rows(q, first, kTk), k, v, rows(dout, first, kTk), mask);
            EXPECT_LE(mt::testing::rho(part.out, rows(full.out, first, kTk)), 1e-12);
            EXPECT_LE(mt::testing::rho(part.lse, lse_rows(full.lse, first, kTk)), 1e-12);
            EXPECT_LE(mt::testing::rho(part.dq, rows(full.dq, first, kTk)), 1e-12);
            EXPECT_LE(mt::testing::rho(part.dk, full.dk), 1e-12);
            EXPECT_LE(mt::testing::rho(part.dv, full.dv), 1e-12);
            ++checked;
        }
    EXPECT_EQ(checked, 12);
}

// Segments [0, s) and [s, Tk) in order: the second attends over all Tk keys; the outputs side by side and the sum of
// both segments' dk, dv equal one pass.
TEST(AttentionKeyPrefix, TwoSegmentsEqualOnePass) {
    const Tensor q = op_randn({kB, kTk, kHq, kD}, 41, 0), k = op_randn({kB, kTk, kHkv, kD}, 41, 1);
    const Tensor v = op_randn({kB, kTk, kHkv, kD}, 41, 2), dout = op_randn({kB, kTk, kHq, kD}, 41, 3);
    for (const AttentionMask& mask : masks())
        for (int64_t s : {int64_t{1}, int64_t{33}, int64_t{64}}) {
            SCOPED_TRACE(::testing::Message() << "split " << s << " window " << mask.window);
            const Grads full = run(q, k, v, dout, mask);
            AttentionMask first_mask = mask;
            if (mask.doc_start.defined()) first_mask.doc_start = mask.doc_start.slice(1, 0, s).clone();
            const Grads a = run(rows(q, 0, s), rows(k, 0, s), rows(v, 0, s), rows(dout, 0, s), first_mask);
            const Grads b = run(rows(q, s, kTk), k, v, rows(dout, s, kTk), mask);
            EXPECT_LE(mt::testing::rho(a.out, rows(full.out, 0, s)), 1e-12);
            EXPECT_LE(mt::testing::rho(b.out, rows(full.out, s, kTk)), 1e-12);
            EXPECT_LE(mt::testing::rho(a.dq, rows(full.dq, 0, s)), 1e-12);
            EXPECT_LE(mt::testing::rho(b.dq, rows(full.dq, s, kTk)), 1e-12);
            Tensor dk = b.dk.clone(), dv = b.dv.clone();  // the second segment's, plus the first's on its keys
            for (int64_t i = 0; i < a.dk.numel(); ++i) {
                const int64_t bb = i / (s * kHkv * kD), rest = i % (s * kHkv * kD);
                const int64_t at = bb * kTk * kHkv * kD + rest;
                core::tensor_set_flat(dk, at, core::tensor_get_flat(dk, at) + core::tensor_get_flat(a.dk, i));
                core::tensor_set_flat(dv, at, core::tensor_get_flat(dv, at) + core::tensor_get_flat(a.dv, i));
            }
            EXPECT_LE(mt::testing::rho(dk, full.dk), 1e-12);
            EXPECT_LE(mt::testing::rho(dv, full.dv), 1e-12);
        }
}

TEST(AttentionKeyPrefix, RefusesShortKeysAndAMapOfTheQueries) {
    const Tensor q = op_randn({kB, 10, kHq, kD}, 5, 0), k = op_randn({kB, 20, kHkv, kD}, 5, 1);
    Tensor out = op_like(q), lse = Tensor::zeros({kB, kHq, 10}, DType::f64);
    EXPECT_THROW(attention_fwd(q, rows(k, 0, 5), rows(k, 0, 5), out, lse), core::Error);
    // The map covers the key positions, not the queries.
    EXPECT_THROW(attention_fwd(q, k, k, out, lse, {}, {.doc_start = Tensor::zeros({kB, 10}, DType::i32)}), core::Error);
}

}  // namespace
}  // namespace mt::ops::test
