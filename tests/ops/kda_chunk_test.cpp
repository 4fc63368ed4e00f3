// The chunked KDA algorithm against the token loop (kda.md §8): f64 outputs, final states and every gradient agree
// to rho < 1e-10 across sub-chunk and chunk boundaries (T = 1 ... 200, T not a multiple of 64, chunks of 64 and
// 32), with and without an initial state, GVA, every gate regime (the softplus gate on the pairwise diagonal);
// the f32 chunked form against the f64 loop (rho <= 1e-5, no Inf/NaN at g = -5); split equals whole through the
// states; causality.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kda_inputs.h"
#include "op_harness.h"
#include "ops/kda.h"

namespace mt::ops::test {
namespace {

const KdaOptions kRecurrent{KdaAlgorithm::recurrent, KdaDiagonal::matmul, 64};

// Worst rho over outputs and gradients of `got` against `ref` (dg excluded when skip_dg), each tensor judged
// against at least 1e-3 rms: with a zero initial state and T = 1 the exact dg is 0 (dg_t = alpha_t rowsum(S_{t-1}
// dS~)), and the chunked form returns the rounding noise of terms that cancel.
double worst_rho(
    const std::string& what, const KdaResult& got, const KdaResult& ref, bool print = false, bool skip_dg = false) {
    const auto a = kda_result_tensors(got), b = kda_result_tensors(ref);
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < a.size(); ++i) {
        if (skip_dg && a[i].first == "dg") continue;
        const double rho = op_parity_rho(a[i].second, b[i].second, 1e-3);
        if (!(rho <= worst)) {  // NaN wins
            worst = rho;
            worst_name = a[i].first;
        }
    }
    if (print) std::printf("[ KDA ] %s: worst rho %.3e (%s)\n", what.c_str(), worst, worst_name.c_str());
    return worst;
}

struct ChunkCase {
    KdaShape shape;
    KdaGateRegime regime;
    bool s0;
    int64_t chunk;
    KdaDiagonal diag;
};

TEST(KdaChunked, MatchesRecurrenceF64) {
    std::vector<ChunkCase> cases;
    for (int64_t t : {1, 15, 16, 17, 63, 64, 65, 130, 200})
        for (bool s0 : {false, true})
            cases.push_back({{2, t, 2, 4, 16, 16}, KdaGateRegime::bounded, s0, 64, KdaDiagonal::matmul});
    for (int64_t t : {31, 33, 97})
        cases.push_back({{1, t, 2, 2, 16, 16}, KdaGateRegime::bounded, true, 32, KdaDiagonal::matmul});
    for (KdaGateRegime r : {KdaGateRegime::floor, KdaGateRegime::near_zero}) {
        cases.push_back({{1, 100, 1, 2, 16, 16}, r, true, 64, KdaDiagonal::matmul});
        cases.push_back({{1, 100, 1, 2, 16, 16}, r, true, 64, KdaDiagonal::pairwise});
    }
    cases.push_back({{1, 150, 1, 2, 16, 16}, KdaGateRegime::softplus, true, 64, KdaDiagonal::pairwise});
    cases.push_back({{1, 70, 1, 2, 16, 16}, KdaGateRegime::softplus, false, 32, KdaDiagonal::pairwise});
    cases.push_back({{1, 130, 2, 2, 64, 128}, KdaGateRegime::bounded, true, 64, KdaDiagonal::matmul});
    cases.push_back({{1, 70, 1, 1, 128, 128}, KdaGateRegime::floor, true, 64, KdaDiagonal::matmul});
    double worst = 0;
    for (const ChunkCase& c : cases) {
        const KdaShape& s = c.shape;
        const std::string name = fmt::format("b{}_t{}_h{}_hv{}_k{}_v{}_regime{}{}_c{}_{}",
                                             s.b,
                                             s.t,
                                             s.h,
                                             s.hv,
                                             s.k,
                                             s.v,
                                             static_cast<int>(c.regime),
                                             c.s0 ? "_s0" : "",
                                             c.chunk,
                                             c.diag == KdaDiagonal::matmul ? "matmul" : "pairwise");
        const KdaInputs in = kda_make_inputs(s, c.regime, c.s0, op_seed(name));
        const KdaResult ref = kda_run(in, kRecurrent, DType::f64, 7);
        const KdaResult got = kda_run(in, {KdaAlgorithm::chunked, c.diag, c.chunk}, DType::f64, 7);
        const double rho = worst_rho(name, got, ref);
        worst = std::max(worst, rho);
        EXPECT_LT(rho, 1e-10) << name;
    }
    std::printf("[ KDA ] chunked vs recurrence, f64, %zu cases: worst rho %.3e\n", cases.size(), worst);
    testing::Test::RecordProperty("worst_rho", fmt::format("{:.3e}", worst));
}

// The f32 chunked form (matmul diagonal) against the f64 loop at the bounded gate's worst case, g = -5 everywhere,
// and at random bounded gates: finite everywhere and rho <= 1e-5 (kda.md §8.2), except dg at g = -5, held to 1e-4:
// the chunked backward forms dg as a reverse cumsum of O(1) terms (q dq, k dk, the state terms) whose exact sum is
// small under strong decay (rms 3e-4 here), so its f32 error is the rounding of those terms relative to a small
// result; the pairwise diagonal shows the same figure, so it is not the anchors (the token loop, which forms dg_t
// as alpha_t times a state product, does not cancel).
TEST(KdaChunked, F32MatchesF64Recurrence) {
    for (KdaGateRegime r : {KdaGateRegime::bounded, KdaGateRegime::floor}) {
        const KdaShape s{1, 150, 2, 2, 64, 64};
        const KdaInputs in = kda_make_inputs(s, r, true, 21 + static_cast<int>(r));
        const KdaResult ref = kda_run(in, kRecurrent, DType::f64, 8);
        const KdaResult got = kda_run(in, {}, DType::f32, 8);
        for (const auto& [name, t] : kda_result_tensors(got)) EXPECT_TRUE(kda_all_finite(t)) << name;
        const std::string what = r == KdaGateRegime::floor ? "f32 chunked, g = -5" : "f32 chunked, bounded g";
        EXPECT_LE(worst_rho(what + ", all but dg", got, ref, true, true), 1e-5);
        const double rho_dg = op_rho(got.dg, ref.dg);
        std::printf("[ KDA ] %s: dg rho %.3e\n", what.c_str(), rho_dg);
        EXPECT_LE(rho_dg, r == KdaGateRegime::floor ? 1e-4 : 1e-5);
    }
}

// One call over T tokens equals two calls that pass the final state on as the next initial state, split at a chunk
// boundary and mid-chunk; the backward chains ds0 of the second call into dst of the first (kda.md §8.4).
TEST(KdaChunked, SplitEqualsWhole) {
    const KdaShape s{1, 150, 1, 2, 8, 8};
    const KdaInputs in = kda_make_inputs(s, KdaGateRegime::bounded, true, 31);
    const int64_t t = s.t;
    const Tensor dout = op_randn({s.b, t, s.hv, s.v}, 32, 0), dst = op_randn({s.b, s.hv, s.k, s.v}, 32, 1);
    auto grads_like = [](const KdaInputs& x) {
        return std::vector<Tensor>{op_like(x.q), op_like(x.k), op_like(x.v), op_like(x.g), op_like(x.beta)};
    };
    const Tensor out = op_like(in.v), st = op_like(in.s0), ds0 = op_like(in.s0);
    kda_fwd(in.q, in.k, in.v, in.g, in.beta, in.s0, out, st);
    const std::vector<Tensor> whole = grads_like(in);
    kda_bwd(in.q, in.k, in.v, in.g, in.beta, in.s0, dout, dst, whole[0], whole[1], whole[2], whole[3], whole[4], ds0);
    for (int64_t cut : {64, 100}) {
        auto part = [&](const Tensor& x, int64_t a, int64_t b) { return x.slice(1, a, b).clone(); };
        KdaInputs p1{part(in.q, 0, cut),
                     part(in.k, 0, cut),
                     part(in.v, 0, cut),
                     part(in.g, 0, cut),
                     part(in.beta, 0, cut),
                     in.s0};
        KdaInputs p2{part(in.q, cut, t),
                     part(in.k, cut, t),
                     part(in.v, cut, t),
                     part(in.g, cut, t),
                     part(in.beta, cut, t),
                     op_like(in.s0)};
        const Tensor o1 = op_like(p1.v), o2 = op_like(p2.v), st2 = op_like(in.s0);
        kda_fwd(p1.q, p1.k, p1.v, p1.g, p1.beta, p1.s0, o1, p2.s0);
        kda_fwd(p2.q, p2.k, p2.v, p2.g, p2.beta, p2.s0, o2, st2);
        const std::vector<Tensor> g1 = grads_like(p1), g2 = grads_like(p2);
        const Tensor ds_mid = op_like(in.s0), ds0_split = op_like(in.s0);
        kda_bwd(
            p2.q, p2.k, p2.v, p2.g, p2.beta, p2.s0, part(dout, cut, t), dst, g2[0], g2[1], g2[2], g2[3], g2[4], ds_mid);
        kda_bwd(p1.q,
                p1.k,
                p1.v,
                p1.g,
                p1.beta,
                p1.s0,
                part(dout, 0, cut),
                ds_mid,
                g1[0],
                g1[1],
                g1[2],
                g1[3],
                g1[4],
                ds0_split);
        double worst = std::max(op_rho(o1, part(out, 0, cut)), op_rho(o2, part(out, cut, t)));
        worst = std::max({worst, op_rho(st2, st), op_rho(ds0_split, ds0)});
        for (size_t i = 0; i < 5; ++i)
            worst = std::max({worst, op_rho(g1[i], part(whole[i], 0, cut)), op_rho(g2[i], part(whole[i], cut, t))});
        std::printf("[ KDA ] split at %ld: worst rho %.3e\n", static_cast<long>(cut), worst);
        EXPECT_LE(worst, 1e-12) << "cut " << cut;
    }
}

// Changing the tokens after position t leaves the outputs up to t bitwise unchanged (kda.md §8.5).
TEST(KdaChunked, Causal) {
    const KdaShape s{1, 90, 1, 1, 8, 8};
    const KdaInputs in = kda_make_inputs(s, KdaGateRegime::bounded, false, 41);
    KdaInputs changed = kda_make_inputs(s, KdaGateRegime::bounded, false, 42);
    const int64_t t0 = 37;  // positions <= t0 keep their values
    for (Tensor* dst : {&changed.q, &changed.k, &changed.v, &changed.g, &changed.beta}) {
        const Tensor& src = dst == &changed.q   ? in.q
                            : dst == &changed.k ? in.k
                            : dst == &changed.v ? in.v
                            : dst == &changed.g ? in.g
                                                : in.beta;
        dst->slice(1, 0, t0 + 1).copy_from(src.slice(1, 0, t0 + 1));
    }
    for (KdaAlgorithm algo : {KdaAlgorithm::chunked, KdaAlgorithm::recurrent}) {
        const Tensor a = op_like(in.v), b = op_like(in.v);
        kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), a, Tensor(), {algo});
        kda_fwd(changed.q, changed.k, changed.v, changed.g, changed.beta, Tensor(), b, Tensor(), {algo});
        const Tensor pa = a.slice(1, 0, t0 + 1).clone(), pb = b.slice(1, 0, t0 + 1).clone();
        EXPECT_EQ(std::memcmp(pa.raw(), pb.raw(), pa.nbytes()), 0);
        EXPECT_GT(op_rho(b, a), 0.1);  // the later outputs did change
    }
}

}  // namespace
}  // namespace mt::ops::test
