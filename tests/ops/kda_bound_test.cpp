// Why KDA's gate is lower-bounded (kda.md §4.2-4.3), demonstrated in f32 against the f64 token loop. The fast
// chunked form puts one anchor on each 16-token diagonal tile, so its column factors reach exp(15 |g|): with the
// bounded gate (g >= -5) that is at most e^75, finite in f32 (largest e^88.7), and the result is accurate; with the
// unbounded softplus gate and strong decay it overflows to Inf/NaN. The unbounded gate needs the slower pairwise
// diagonal, which is accurate again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "kda_inputs.h"
#include "op_harness.h"
#include "ops/kda.h"

namespace mt::ops::test {
namespace {

const KdaOptions kRecurrent{KdaAlgorithm::recurrent, KdaDiagonal::matmul, 64};
const KdaOptions kMatmul{KdaAlgorithm::chunked, KdaDiagonal::matmul, 64};
const KdaOptions kPairwise{KdaAlgorithm::chunked, KdaDiagonal::pairwise, 64};

struct F32Outcome {
    bool finite = true;  // out, st and every gradient finite
    double rho = 0;      // worst rho of out, st and the gradients but dg against the f64 recurrence (NaN if not finite)
    double rho_dg = 0;   // rho of dg
};

F32Outcome run_f32(const KdaInputs& in, const KdaOptions& options) {
    const KdaResult ref = kda_run(in, kRecurrent, DType::f64, 5);
    const KdaResult got = kda_run(in, options, DType::f32, 5);
    F32Outcome r;
    const auto a = kda_result_tensors(got), b = kda_result_tensors(ref);
    for (size_t i = 0; i < a.size(); ++i) {
        r.finite = r.finite && kda_all_finite(a[i].second);
        const double rho = op_rho(a[i].second, b[i].second);
        if (a[i].first == "dg") {
            r.rho_dg = rho;
        } else if (!(rho <= r.rho)) {
            r.rho = rho;
        }
    }
    return r;
}

// Constant log decay g = -c on every channel. The matmul diagonal is finite and accurate up to c = 5 (the bound)
// and overflows once 15 c passes f32's exp range (88.7), from c = 6 on. The pairwise diagonal stays finite, but
// past the bound its dg loses precision too: dg is a sum of O(1) terms that cancel to a value of order e^-c (see
// KdaChunked.F32MatchesF64Recurrence), so its relative f32 error grows like e^c.
TEST(KdaBound, ConstantDecaySweepF32) {
    const KdaShape s{1, 64, 1, 1, 16, 16};
    std::printf(
        "[ KDA BOUND ] constant g = -c, f32 chunked vs f64 recurrence (rho of out, st, dq, dk, dv, dbeta, ds0; "
        "then dg)\n");
    for (double c : {0.5, 2.0, 5.0, 6.0, 8.0, 20.0}) {
        KdaInputs in = kda_make_inputs(s, KdaGateRegime::bounded, true, 61);
        in.g.fill(-c);
        const F32Outcome m = run_f32(in, kMatmul), p = run_f32(in, kPairwise);
        std::printf(
            "[ KDA BOUND ]   c = %4.1f  column factor up to e^%5.1f  matmul: %s rho %.3e dg %.3e  "
            "pairwise: rho %.3e dg %.3e\n",
            c,
            15 * c,
            m.finite ? "finite    " : "NOT FINITE",
            m.rho,
            m.rho_dg,
            p.rho,
            p.rho_dg);
        EXPECT_TRUE(p.finite) << c;
        EXPECT_LE(p.rho, 1e-5) << c;
        if (c <= 5.0) {
            EXPECT_TRUE(m.finite) << c;
            EXPECT_LE(m.rho, 1e-5) << c;
            EXPECT_LE(m.rho_dg, 1e-4) << c;
            EXPECT_LE(p.rho_dg, 1e-4) << c;
        } else {
            EXPECT_FALSE(m.finite) << c;  // 15 c > 88.7: the column factor is Inf (Inf * 0 = NaN once masked)
        }
        if (c >= 20.0) {
            EXPECT_GT(p.rho_dg, 1e-2) << c;  // dg of order e^-20: f32 noise of the O(1) terms wins
        }
    }
}

// Gates of the two parameterisations on the same strong pre-activations: the bounded gate l sigmoid(a (u + b))
// saturates at l = -5 and the fast form stays accurate; Kimi Linear's -a softplus(u + b) (a up to 16, g down to
// about -160) makes the fast form non-finite, and only the pairwise diagonal recovers it.
TEST(KdaBound, BoundedVersusSoftplusGateF32) {
    const KdaShape s{1, 100, 1, 2, 32, 32};
    const KdaInputs bounded = kda_make_inputs(s, KdaGateRegime::bounded, true, 71);
    KdaInputs strong = bounded;
    strong.g = kda_gate_values(s, KdaGateRegime::softplus, 71);
    double gmin = 0;
    for (int64_t i = 0; i < strong.g.numel(); ++i) gmin = std::min(gmin, core::tensor_get_flat(strong.g, i));

    const F32Outcome b_fast = run_f32(bounded, kMatmul);
    const F32Outcome s_fast = run_f32(strong, kMatmul);
    const F32Outcome s_pair = run_f32(strong, kPairwise);
    std::printf("[ KDA BOUND ] bounded gate (l = -5), matmul diagonal:   %s rho %.3e dg %.3e\n",
                b_fast.finite ? "finite" : "NOT FINITE",
                b_fast.rho,
                b_fast.rho_dg);
    std::printf("[ KDA BOUND ] softplus gate (min g %.1f), matmul diagonal: %s rho %.3e dg %.3e\n",
                gmin,
                s_fast.finite ? "finite" : "NOT FINITE",
                s_fast.rho,
                s_fast.rho_dg);
    std::printf("[ KDA BOUND ] softplus gate, pairwise diagonal:         %s rho %.3e dg %.3e\n",
                s_pair.finite ? "finite" : "NOT FINITE",
                s_pair.rho,
                s_pair.rho_dg);
    EXPECT_TRUE(b_fast.finite);
    EXPECT_LE(b_fast.rho, 1e-5);
    EXPECT_LE(b_fast.rho_dg, 1e-5);
    EXPECT_LT(gmin, -100.0);
    EXPECT_FALSE(s_fast.finite);
    EXPECT_TRUE(s_pair.finite);
    EXPECT_LE(s_pair.rho, 1e-5);
}

// In f64 the same overflow waits for 15 |g| > 709: the softplus gate at g = -50 still breaks the fast form there.
TEST(KdaBound, SoftplusBreaksMatmulDiagonalEvenInF64) {
    const KdaShape s{1, 32, 1, 1, 8, 8};
    KdaInputs in = kda_make_inputs(s, KdaGateRegime::bounded, false, 81);
    in.g.fill(-50.0);
    const KdaResult ref = kda_run(in, kRecurrent, DType::f64, 5);
    const KdaResult fast = kda_run(in, kMatmul, DType::f64, 5);
    const KdaResult pair = kda_run(in, kPairwise, DType::f64, 5);
    EXPECT_FALSE(kda_all_finite(fast.out));
    EXPECT_LE(op_rho(pair.out, ref.out), 1e-12);
}

}  // namespace
}  // namespace mt::ops::test
