// Cases and argument checks of causal GQA attention (ops/attention.h): T = 1, prime T, T across the 64-row query
// blocks, Hq != Hkv.
#include "ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase attention_case(int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d) {
    const std::string name = fmt::format("attention_b{}_t{}_hq{}_hkv{}_d{}", b, t, hq, hkv, d);
    return {"attention", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"q", op_randn({b, t, hq, d}, s, 0), GradKind::written},
                            {"k", op_randn({b, t, hkv, d}, s, 1), GradKind::written},
                            {"v", op_randn({b, t, hkv, d}, s, 2), GradKind::written}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor out = op_like(in[0]), lse = op_like(in[0], {b, hq, t});
                    attention_fwd(in[0], in[1], in[2], out, lse);
                    return std::vector<Tensor>{out};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    Tensor out = op_like(in[0]), lse = op_like(in[0], {b, hq, t});
                    attention_fwd(in[0], in[1], in[2], out, lse);
                    attention_bwd(in[0], in[1], in[2], out, lse, dout[0], grads[0], grads[1], grads[2]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(attention_case(1, 1, 1, 1, 1));
    op_register(attention_case(2, 1, 2, 2, 4));   // T = 1
    op_register(attention_case(2, 5, 2, 1, 3));   // GQA, groups of 2
    op_register(attention_case(1, 13, 3, 3, 5));  // T prime
    op_register(attention_case(1, 7, 6, 2, 8));   // GQA, groups of 3
    op_register(attention_case(1, 67, 4, 2, 4));  // T across two query blocks
    op_register(attention_case(2, 131, 2, 1, 6));
    return true;
}();

// Output and lse against the definition written out directly (naive loops) on a GQA case.
TEST(OpAttention, MatchesNaiveDefinition) {
    const int64_t b = 2, t = 70, hq = 4, hkv = 2, d = 3;
    const Tensor q = op_randn({b, t, hq, d}, 9, 0), k = op_randn({b, t, hkv, d}, 9, 1),
                 v = op_randn({b, t, hkv, d}, 9, 2);
    const Tensor out = op_like(q), lse = op_like(q, {b, hq, t});
    attention_fwd(q, k, v, out, lse);
    double worst = 0;
    for (int64_t bb = 0; bb < b; ++bb) {
        for (int64_t h = 0; h < hq; ++h) {
            const int64_t kh = h / (hq / hkv);
            for (int64_t i = 0; i < t; ++i) {
                std::vector<double> s(static_cast<size_t>(i + 1));
                double mx = -1e300, sum = 0;
                for (int64_t j = 0; j <= i; ++j) {
                    double dot = 0;
                    for (int64_t c = 0; c < d; ++c) dot += q.at({bb, i, h, c}) * k.at({bb, j, kh, c});
                    s[j] = dot / std::sqrt(static_cast<double>(d));
                    mx = std::max(mx, s[j]);
                }
                for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
                worst = std::max(worst, std::fabs(lse.at({bb, h, i}) - (mx + std::log(sum))));
                for (int64_t c = 0; c < d; ++c) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; ++j) o += std::exp(s[j] - mx) / sum * v.at({bb, j, kh, c});
                    worst = std::max(worst, std::fabs(out.at({bb, i, h, c}) - o));
                }
            }
        }
    }
    EXPECT_LT(worst, 1e-12);
}

TEST(OpArgs, AttentionShapesAndDtypes) {
    const Tensor q = Tensor::zeros({2, 3, 4, 5}, DType::f32), k = Tensor::zeros({2, 3, 2, 5}, DType::f32);
    const Tensor v = op_like(k), out = op_like(q), lse = Tensor::zeros({2, 4, 3}, DType::f32);
    attention_fwd(q, k, v, out, lse);
    expect_op_error(
        [&] {
            attention_fwd(
                q, Tensor::zeros({2, 3, 3, 5}, DType::f32), Tensor::zeros({2, 3, 3, 5}, DType::f32), out, lse);
        },
        "attention_fwd: q has 4 heads and k has 3; Hq must be a multiple of Hkv");
    expect_op_error(
        [&] {
            attention_fwd(q, k, Tensor::zeros({2, 3, 2, 4}, DType::f32), out, lse);
        },
        "attention_fwd: v has shape [2, 3, 2, 4], expected [2, 3, 2, 5]");
    expect_op_error(
        [&] {
            attention_fwd(q, Tensor::zeros({2, 4, 2, 5}, DType::f32), v, out, lse);
        },
        "attention_fwd: k has shape [2, 4, 2, 5], expected [2, 3, 2, 5]");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, out, Tensor::zeros({2, 3, 4}, DType::f32));
        },
        "attention_fwd: lse has shape [2, 3, 4], expected [2, 4, 3]");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, Tensor::zeros({2, 3, 4, 4}, DType::f32), lse);
        },
        "attention_fwd: out has shape [2, 3, 4, 4], expected [2, 3, 4, 5]");
    expect_op_error([&] { attention_fwd(q, k.to(DType::f64), v, out, lse); },
                    "attention_fwd: k has dtype f64, expected f32 (the dtype of q)");
    expect_op_error([&] { attention_fwd(q.to(DType::bf16), k, v, out, lse); }, "attention_fwd: q has dtype bf16");
    expect_op_error(
        [&] {
            attention_fwd(op_noncontiguous({2, 3, 4, 5}, DType::f32), k, v, out, lse);
        },
        "attention_fwd: q must be contiguous");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, out, op_cuda_view({2, 4, 3}, DType::f32));
        },
        "attention_fwd: lse is a cuda tensor; attention_fwd is not implemented on cuda yet");

    const Tensor dq = op_like(q), dk = op_like(k), dv = op_like(v);
    attention_bwd(q, k, v, out, lse, out, dq, dk, dv);
    expect_op_error([&] { attention_bwd(q, k, v, out, lse, out, dq, dk, op_like(q)); },
                    "attention_bwd: dv has shape [2, 3, 4, 5], expected [2, 3, 2, 5]");
    expect_op_error([&] { attention_bwd(q, k, v, out, lse, out.to(DType::f64), dq, dk, dv); },
                    "attention_bwd: dout has dtype f64, expected f32 (the dtype of q)");
    expect_op_error(
        [&] {
            attention_bwd(q, k, v, out, lse, out, op_noncontiguous({2, 3, 4, 5}, DType::f32), dk, dv);
        },
        "attention_bwd: dq must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
