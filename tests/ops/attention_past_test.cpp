// Attention over a past key block merged into a running result (ops/attention_past.h), the step of ring context
// parallelism: harness cases (gradients by finite differences in f64, f32 against f64, thread counts; CPU only, so no
// CUDA parity) with a running result to merge into, per-query first keys and rows that see none of the block; and
// the ring's identity: causal attention over a row's own keys followed by the merge of the keys before them equals
// causal attention over all of them (outputs, lse and every gradient, f64 rho <= 1e-12), with documents.
#include "ops/attention_past.h"

#include <gtest/gtest.h>

#include <limits>

#include "op_harness.h"
#include "ops/attention.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

// A running result to merge into: random out and lse, and lse = -inf (nothing merged yet, out 0) in every third row.
std::pair<Tensor, Tensor> running(const Tensor& q, uint64_t seed) {
    const int64_t b = q.size(0), t = q.size(1), hq = q.size(2);
    Tensor out = op_randn(q.shape(), seed, 7).to(q.dtype()), lse = op_randn({b, hq, t}, seed, 8).to(q.dtype());
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t i = 0; i < t; i += 3)
            for (int64_t h = 0; h < hq; ++h) {
                core::tensor_set_flat(lse, (bb * hq + h) * t + i, -std::numeric_limits<double>::infinity());
                out.select(0, bb).select(0, i).select(0, h).zero();
            }
    return {out, lse};
}

OpCase past_case(int64_t b, int64_t t, int64_t tk, int64_t hq, int64_t hkv, int64_t d, bool first) {
    const std::string name =
        fmt::format("attention_past_b{}_t{}_tk{}_hq{}_hkv{}_d{}{}", b, t, tk, hq, hkv, d, first ? "_first" : "");
    OpCase c{"attention_past", name, [=] {
                 const uint64_t s = op_seed(name);
                 // Each query's first visible key, Tk (none) included.
                 const Tensor f = first ? op_rand_ids({b, t}, s, 9, 0, static_cast<int32_t>(tk + 1)) : Tensor();
                 OpProblem p;
                 p.inputs = {{"q", op_randn({b, t, hq, d}, s, 0), GradKind::accumulated},
                             {"k", op_randn({b, tk, hkv, d}, s, 1), GradKind::written},
                             {"v", op_randn({b, tk, hkv, d}, s, 2), GradKind::written}};
                 auto merged = [=](const std::vector<Tensor>& in) {
                     auto [out, lse] = running(in[0], s);
                     attention_past_fwd(in[0], in[1], in[2], f, out, lse);
                     return std::pair{out, lse};
                 };
                 p.forward = [=](const std::vector<Tensor>& in) { return std::vector<Tensor>{merged(in).first}; };
                 p.backward = [=](const std::vector<Tensor>& in,
                                  const std::vector<Tensor>& dout,
                                  const std::vector<Tensor>& grads) {
                     const auto [out, lse] = merged(in);
                     attention_past_bwd(in[0], in[1], in[2], f, out, lse, dout[0], grads[0], grads[1], grads[2]);
                 };
                 return p;
             }};
    c.parity.bf16 = c.parity.f16 = c.parity.f32 = false;  // CPU only
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(past_case(1, 1, 1, 1, 1, 1, false));
    op_register(past_case(2, 5, 3, 2, 1, 4, true));   // GQA, empty rows
    op_register(past_case(1, 13, 7, 3, 3, 5, true));  // primes
    op_register(past_case(2, 4, 17, 4, 2, 3, false));
    return true;
}();

// Row positions [s, tk) attend causally to keys [0, tk): their own keys [s, tk) by attention_fwd (a key prefix of
// length tk - s) and the keys [0, s) by the merge; with the final out and lse both backwards give that of one call.
TEST(AttentionPast, OwnKeysThenThePastEqualCausalAttentionOverAll) {
    constexpr int64_t kB = 2, kTk = 41, kHq = 4, kHkv = 2, kD = 5;
    const Tensor q = op_randn({kB, kTk, kHq, kD}, 3, 0), k = op_randn({kB, kTk, kHkv, kD}, 3, 1);
    const Tensor v = op_randn({kB, kTk, kHkv, kD}, 3, 2), dout = op_randn({kB, kTk, kHq, kD}, 3, 3);
    // Row 0: documents from 0, 9, 17 (a boundary right at s = 17 below) and 30; row 1: one document.
    const Tensor docs = mt::testing::doc_start_map({{0, 9, 17, 30}, {0}}, kTk);
    for (const bool documents : {false, true})
        for (const int64_t s : {int64_t{1}, int64_t{17}, int64_t{23}}) {
            SCOPED_TRACE(::testing::Message() << "split " << s << " documents " << documents);
            const AttentionMask mask{.doc_start = documents ? docs : Tensor()};
            const int64_t t = kTk - s;
            const Tensor qs = q.slice(1, s, kTk).clone(), ds = dout.slice(1, s, kTk).clone();
            // One call: the queries the last t of the tk keys.
            Tensor out = op_like(qs), lse = op_like(qs, {kB, kHq, t});
            Tensor dq = op_like(qs), dk = op_like(k), dv = op_like(v);
            attention_fwd(qs, k, v, out, lse, {}, mask);
            attention_bwd(qs, k, v, out, lse, ds, dq, dk, dv, {}, mask);
            // Own keys, then the past block [0, s) with each query's first key min(doc start, s).
            const Tensor ko = k.slice(1, s, kTk).clone(), vo = v.slice(1, s, kTk).clone();
            const Tensor kp = k.slice(1, 0, s).clone(), vp = v.slice(1, 0, s).clone();
            AttentionMask own;
            Tensor first;
            if (documents) {
                own.doc_start = op_like(docs, {kB, t});
                first = op_like(docs, {kB, t});
                for (int64_t b = 0; b < kB; ++b)
                    for (int64_t i = 0; i < t; ++i) {
                        const int64_t start = static_cast<int64_t>(docs.at({b, s + i}));
                        core::tensor_set_flat(
                            own.doc_start, b * t + i, static_cast<double>(std::max<int64_t>(start - s, 0)));
                        core::tensor_set_flat(first, b * t + i, static_cast<double>(std::min(start, s)));
                    }
            }
            Tensor out2 = op_like(qs), lse2 = op_like(lse);
            attention_fwd(qs, ko, vo, out2, lse2, {}, own);
            attention_past_fwd(qs, kp, vp, first, out2, lse2);
            EXPECT_LE(mt::testing::rho(out2, out), 1e-12);
            EXPECT_LE(mt::testing::rho(lse2, lse), 1e-12);
            Tensor dq2 = op_like(qs), dko = op_like(ko), dvo = op_like(vo), dkp = op_like(kp), dvp = op_like(vp);
            attention_bwd(qs, ko, vo, out2, lse2, ds, dq2, dko, dvo, {}, own);
            attention_past_bwd(qs, kp, vp, first, out2, lse2, ds, dq2, dkp, dvp);
            EXPECT_LE(mt::testing::rho(dq2, dq), 1e-12);
            EXPECT_LE(mt::testing::rho(dko, dk.slice(1, s, kTk).clone()), 1e-12);
            EXPECT_LE(mt::testing::rho(dvo, dv.slice(1, s, kTk).clone()), 1e-12);
            EXPECT_LE(mt::testing::rho(dkp, dk.slice(1, 0, s).clone()), 1e-12);
            EXPECT_LE(mt::testing::rho(dvp, dv.slice(1, 0, s).clone()), 1e-12);
        }
}

TEST(OpArgs, AttentionPastShapes) {
    const Tensor q = Tensor::zeros({2, 3, 4, 5}, DType::f32), k = Tensor::zeros({2, 6, 2, 5}, DType::f32);
    const Tensor out = op_like(q), lse = Tensor::zeros({2, 4, 3}, DType::f32);
    attention_past_fwd(q, k, op_like(k), Tensor(), out, lse);
    expect_op_error(
        [&] {
            attention_past_fwd(q, Tensor::zeros({2, 6, 3, 5}, DType::f32), op_like(k), Tensor(), out, lse);
        },
        "Hq a multiple of Hkv");
    expect_op_error(
        [&] {
            attention_past_fwd(q, k, op_like(k), Tensor::zeros({2, 4}, DType::i32), out, lse);
        },
        "first");
}

}  // namespace
}  // namespace mt::ops::test
