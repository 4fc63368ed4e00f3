// Cases and argument checks of the Block AttnRes mix (ops/attnres_mix.h): m = 1, 2, 3, 10 sources (spec attnres.md
// §11.3), token counts across the 64-token blocks of the gain/query gradient, and CUDA-sized rows. The CUDA kernels
// (ops/cuda/attnres/) have one kernel per source count 1..8 on the vector path (C a multiple of 8) and a generic
// one (m > 8, or C not a multiple of 8); the cases cover both, N = 1 and N across the 4-warp blocks and 8-token
// chunks, and parity mode runs each twice for the same bits. d_sources in the sources' own dtype (parity runs give
// the bf16 and f16 ones f32 buffers) and query/key_gain of another dtype than the sources have their own check.
#include "ops/attnres_mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase attnres_case(int64_t m, int64_t n, int64_t c, double eps = 1e-6, double blend = 0.0) {
    const std::string name =
        fmt::format("attnres_mix_m{}_n{}_c{}", m, n, c) + (blend > 0 ? fmt::format("_blend{}", blend) : "");
    return {
        "attnres_mix", name, [=] {
            const uint64_t s = op_seed(name);
            OpProblem p;
            for (int64_t j = 0; j < m; ++j)
                p.inputs.push_back({fmt::format("v{}", j),
                                    op_randn({n, c}, s, static_cast<uint64_t>(j), 0.0, 1.0 + 0.3 * j),
                                    GradKind::accumulated});
            // The query's scale keeps the logits O(1) at every C (std about 2 from C = 16 up), as in a trained
            // model. At std 0.5 a C = 1536 row gave logits of std 20: a softmax that all but ignores most sources,
            // whose weights (and gradients) then carry the logits' absolute f32 rounding, ~1e-4 for a 1536-term
            // dot product, as a relative error (7.6e-4 seen on an H100, against a budget of 5e-5).
            const double query_std = std::min(0.5, 2.0 / std::sqrt(static_cast<double>(c)));
            p.inputs.push_back({"query", op_randn({c}, s, 100, 0.0, query_std), GradKind::accumulated});
            p.inputs.push_back({"key_gain", op_randn({c}, s, 101, 1.0, 0.2), GradKind::accumulated});
            auto split = [m](const std::vector<Tensor>& in) { return std::vector<Tensor>(in.begin(), in.begin() + m); };
            p.forward = [=](const std::vector<Tensor>& in) {
                Tensor h = op_like(in[0]), alpha = op_stat_like(in[0], {n, m});
                attnres_mix_fwd(split(in), in[m], in[m + 1], eps, h, alpha, blend);
                return std::vector<Tensor>{h};
            };
            p.backward =
                [=](const std::vector<Tensor>& in, const std::vector<Tensor>& dout, const std::vector<Tensor>& grads) {
                    Tensor h = op_like(in[0]), alpha = op_stat_like(in[0], {n, m});
                    attnres_mix_fwd(split(in), in[m], in[m + 1], eps, h, alpha, blend);
                    attnres_mix_bwd(
                        split(in), in[m], in[m + 1], eps, alpha, dout[0], split(grads), grads[m], grads[m + 1], blend);
                };
            return p;
        }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(attnres_case(1, 5, 8));  // one source: alpha = 1, only dv is nonzero
    op_register(attnres_case(2, 7, 5));
    op_register(attnres_case(3, 131, 16));  // three blocks of the query/gain gradient
    op_register(attnres_case(10, 9, 12));
    op_register(attnres_case(4, 301, 130));  // on the OpenMP team
    // The residual blend (spec §5): weights lambda / m + (1 - lambda) alpha; lambda = 1 leaves only the uniform mean
    // (then the query and gain get no gradient).
    op_register(attnres_case(3, 131, 16, 1e-6, 0.3));
    op_register(attnres_case(5, 70, 33, 1e-6, 1.0));
    // At C = 2048 the f32 sums of the backward (da_j over C terms, then ds_j = a_j (da_j - sum_k a_k da_k), a
    // difference of nearly equal terms) carry about 1e-5 relative rounding on either side (1.1e-5 to 1.5e-5 seen
    // on an H200); the budget is 5e-5.
    // Model-sized rows (d_model 1536) through the CUDA kernels: fixed m = 1, 2, 3, 5, 8 and generic m = 9, 17, 32
    // on the vector path, N = 1, an odd C (the generic scalar path) and the blend; the same budget for C >= 1536.
    for (auto [m, n, c, blend] : {std::tuple{6, 257, 2048, 0.0},
                                  std::tuple{10, 67, 2049, 0.0},
                                  std::tuple{1, 37, 1536, 0.0},
                                  std::tuple{2, 67, 1536, 0.0},
                                  std::tuple{3, 45, 1536, 0.0},
                                  std::tuple{5, 131, 1536, 0.0},
                                  std::tuple{5, 1, 1536, 0.0},
                                  std::tuple{5, 29, 1536, 0.25},
                                  std::tuple{8, 45, 1536, 0.0},
                                  std::tuple{9, 23, 1536, 0.0},
                                  std::tuple{17, 13, 1536, 0.0},
                                  std::tuple{32, 9, 1536, 0.0},
                                  std::tuple{3, 37, 1537, 0.0},
                                  std::tuple{5, 21, 1540, 0.0}}) {
        OpCase big = op_parity_only(attnres_case(m, n, c, 1e-6, blend));
        big.parity.f32_budget = 5e-5;
        big.parity.budget_reason = "f32 rounding of C = 2048 sums followed by the softmax-gradient cancellation";
        op_register(big);
    }
    // Small shapes of the CUDA paths, in every mode: N = 1 and C = 8; m = 5 and 8 with N not a multiple of the
    // 4-warp blocks or the 8-token chunks; the generic kernel on the vector path (m = 9, 17, 32) and m = 5 on the
    // scalar path (C = 20).
    op_register(attnres_case(2, 1, 8));
    op_register(attnres_case(5, 13, 24));
    op_register(attnres_case(8, 19, 8));
    op_register(attnres_case(9, 11, 16));
    op_register(attnres_case(17, 5, 8));
    op_register(attnres_case(32, 3, 16));
    op_register(attnres_case(5, 17, 20, 1e-6, 0.4));
    return true;
}();

TEST(OpArgs, AttnresMixShapesAndCounts) {
    const Tensor v = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({4}, DType::f32);
    const Tensor h = op_like(v), alpha = Tensor::zeros({3, 2}, DType::f32);
    attnres_mix_fwd({v, v}, w, w, 1e-6, h, alpha);
    expect_op_error([&] { attnres_mix_fwd({}, w, w, 1e-6, h, alpha); },
                    "attnres_mix_fwd: sources holds 0 tensors, expected 1 to 32");
    expect_op_error(
        [&] {
            attnres_mix_fwd({v, Tensor::zeros({3, 5}, DType::f32)}, w, w, 1e-6, h, alpha);
        },
        "attnres_mix_fwd: sources[1] has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { attnres_mix_fwd({v}, w, w, 1e-6, h, alpha); },
                    "attnres_mix_fwd: alpha has shape [3, 2], expected [3, 1]");
    expect_op_error(
        [&] {
            attnres_mix_fwd({v, v}, Tensor::zeros({3}, DType::f32), w, 1e-6, h, alpha);
        },
        "attnres_mix_fwd: query has shape [3], expected [4]");
    expect_op_error(
        [&] {
            attnres_mix_fwd({v, v}, w.to(DType::f64), w, 1e-6, h, alpha);
        },
        "attnres_mix_fwd: query has dtype f64, expected f32 (the dtype of the sources)");
    expect_op_error(
        [&] {
            attnres_mix_bwd({v, v}, w, w, 1e-6, alpha, h, {v}, w, w);
        },
        "attnres_mix_bwd: d_sources holds 1 tensors, expected 2 (one per source)");
    const Tensor dv = op_like(v), both = Tensor::zeros({6, 4}, DType::f32);
    expect_op_error(
        [&] {
            attnres_mix_bwd({v, v}, w, w, 1e-6, alpha, h, {dv, dv}, w, w);
        },
        "attnres_mix_bwd: d_sources[0] and d_sources[1] share memory");
    // Adjacent views of one buffer do not overlap: allowed.
    attnres_mix_bwd({v, v}, w, w, 1e-6, alpha, h, {both.slice(0, 0, 3), both.slice(0, 3, 6)}, w, w);
}

// Spec §11.5: blend 0 is the unblended mix bitwise; blend 1 is the plain mean of the sources whatever the query;
// in between, h = lambda mean + (1 - lambda) h_0.
TEST(AttnresMix, ResidualBlendEndpointsAndInterpolation) {
    const int64_t m = 4, n = 5, c = 7;
    std::vector<Tensor> v;
    for (int64_t j = 0; j < m; ++j) v.push_back(op_randn({n, c}, 11, static_cast<uint64_t>(j)));
    const Tensor query = op_randn({c}, 11, 8, 0.0, 0.7), gain = op_randn({c}, 11, 9, 1.0, 0.2);
    auto mix = [&](double blend) {
        Tensor h = Tensor::zeros({n, c}, DType::f64), alpha = Tensor::zeros({n, m}, DType::f64);
        attnres_mix_fwd(v, query, gain, 1e-6, h, alpha, blend);
        return h;
    };
    const Tensor plain = Tensor::zeros({n, c}, DType::f64), alpha = Tensor::zeros({n, m}, DType::f64);
    attnres_mix_fwd(v, query, gain, 1e-6, plain, alpha);
    const Tensor h0 = mix(0.0), h1 = mix(1.0), h3 = mix(0.3);
    for (int64_t i = 0; i < n * c; ++i) {
        double mean = 0;
        for (int64_t j = 0; j < m; ++j) mean += core::tensor_get_flat(v[j], i) / m;
        EXPECT_EQ(core::tensor_get_flat(h0, i), core::tensor_get_flat(plain, i));
        EXPECT_NEAR(core::tensor_get_flat(h1, i), mean, 1e-15);
        EXPECT_NEAR(core::tensor_get_flat(h3, i), 0.3 * mean + 0.7 * core::tensor_get_flat(plain, i), 1e-14);
    }
    expect_op_error(
        [&] {
            Tensor h = Tensor::zeros({n, c}, DType::f64);
            attnres_mix_fwd(v, query, gain, 1e-6, h, alpha, 1.5);
        },
        "attnres_mix_fwd: blend = 1.5 must be in [0, 1]");
}

TEST(AttnresMix, ZeroQueryIsTheUniformMean) {
    // Spec §4: with w = 0 every logit is 0, alpha = 1/m and h is the plain mean of the sources.
    const int64_t m = 3, n = 4, c = 6;
    std::vector<Tensor> v;
    for (int64_t j = 0; j < m; ++j) v.push_back(op_randn({n, c}, 7, static_cast<uint64_t>(j)));
    const Tensor zero = Tensor::zeros({c}, DType::f64), gain = op_randn({c}, 7, 9, 1.0, 0.2);
    Tensor h = Tensor::zeros({n, c}, DType::f64), alpha = Tensor::zeros({n, m}, DType::f64);
    attnres_mix_fwd(v, zero, gain, 1e-6, h, alpha);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < c; ++k) {
            double mean = 0;
            for (int64_t j = 0; j < m; ++j) mean += core::tensor_get_flat(v[j], i * c + k) / m;
            EXPECT_NEAR(core::tensor_get_flat(h, i * c + k), mean, 1e-15);
        }
    for (int64_t i = 0; i < n * m; ++i) EXPECT_DOUBLE_EQ(core::tensor_get_flat(alpha, i), 1.0 / m);
}

}  // namespace
}  // namespace mt::ops::test
