// The loss weightings of loss.weighting (train/loss_weighting.h, multimodal.md §5 and §9 item 5) on scripted per-source
// losses: the uncertainty's s_i after AdamW steps and the DWA weights after each window equal values computed by hand
// (the formulas of §5, evaluated independently in Python: the literals below), as do GradNorm's w after its steps from
// given gradient norms, token_mean is the plain mean, and the state survives a checkpoint's JSON exactly.
#include "train/loss_weighting.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mt::train {
namespace {

LossConfig weighting(const std::string& kind) {
    LossConfig c;
    c.weighting = kind;
    c.uncertainty_lr = 0.1;
    c.dwa_window = 2;
    c.dwa_temperature = 2.0;
    return c;
}

TEST(LossWeighting, TokenMeanIsThePlainMean) {
    const LossWeighting w(weighting("token_mean"), 2, 0.9, 0.95, 1e-8);
    EXPECT_TRUE(w.plain());
    EXPECT_EQ(w.multipliers({3, 4}), (std::vector<double>{1.0, 1.0}));
    EXPECT_DOUBLE_EQ(w.objective({6, 4}, {3, 4}), 10.0 / 7.0);
}

TEST(LossWeighting, UncertaintyMatchesHandComputedAdamWSteps) {
    LossWeighting w(weighting("uncertainty"), 2, 0.9, 0.95, 1e-8);
    // s = 0: the weights are exp(-0) = 1 and a source's tokens weigh N / N_i against the token mean.
    EXPECT_EQ(w.weights(), (std::vector<double>{1.0, 1.0}));
    EXPECT_DOUBLE_EQ(w.multipliers({3, 4})[0], 7.0 / 3.0);
    // Step 1: L = (2, 1), gradient -exp(-s) L + 1/2 = (-1.5, -0.5); Adam's first step moves each s by lr g / (|g| +
    // eps).
    w.update({6, 4}, {3, 4}, /*lr, unused: loss.uncertainty_lr is set*/ 1.0);
    EXPECT_NEAR(w.log_variances()[0], 0.09999999933333335, 1e-15);
    EXPECT_NEAR(w.log_variances()[1], 0.09999999800000003, 1e-15);
    // Step 2: L = (1, 1).
    w.update({3, 4}, {3, 4}, 1.0);
    EXPECT_NEAR(w.log_variances()[0], 0.18501687905944372, 1e-14);
    EXPECT_NEAR(w.log_variances()[1], 0.1991658484375846, 1e-14);
    const std::vector<double> m = w.multipliers({3, 4});  // N exp(-s_i) / N_i
    EXPECT_NEAR(m[0], 1.9392105966611137, 1e-13);
    EXPECT_NEAR(m[1], 1.4339744711847084, 1e-13);
    EXPECT_NEAR(w.objective({3, 4}, {3, 4}), 1.8425956029945392, 1e-13);  // sum exp(-s_i) L_i + s_i / 2
    // A source without tokens in a step gets no gradient of its own (its moments still decay).
    const double before = w.log_variances()[1];
    w.update({3, 0}, {3, 0}, 1.0);
    EXPECT_NE(w.log_variances()[1], before);
    EXPECT_EQ(w.multipliers({3, 0})[1], 0.0);
}

TEST(LossWeighting, DwaMatchesHandComputedWindows) {
    LossWeighting w(weighting("dwa"), 2, 0.9, 0.95, 1e-8);
    // Scripted L_i per step (N_i = 1): window means (3, 2), then (1.5, 2), then (1, 1).
    const std::vector<std::vector<double>> losses = {{4, 2}, {2, 2}, {2, 2}, {1, 2}, {1, 1}, {1, 1}};
    for (size_t t = 0; t < losses.size(); ++t) {
        if (t < 4) {
            EXPECT_EQ(w.weights(), (std::vector<double>{1.0, 1.0})) << "w = 1 in the first two windows";
        }
        w.update(losses[t], {1, 1}, 0.0);
        if (t == 3) {  // rho = (1.5 / 3, 2 / 2): w_i = 2 exp(rho_i / 2) / sum_k exp(rho_k / 2)
            EXPECT_NEAR(w.weights()[0], 0.8756469982284038, 1e-14);
            EXPECT_NEAR(w.weights()[1], 1.1243530017715964, 1e-14);
            EXPECT_EQ(w.multipliers({5, 9}), w.weights());  // w_i / N against 1 / N
        }
    }
    // rho = (1 / 1.5, 1 / 2).
    EXPECT_NEAR(w.weights()[0], 1.0416425707454862, 1e-14);
    EXPECT_NEAR(w.weights()[1], 0.9583574292545141, 1e-14);
    EXPECT_NEAR(w.weights()[0] + w.weights()[1], 2.0, 1e-14);
}

TEST(LossWeighting, GradNormMatchesHandComputedSteps) {
    LossConfig cfg = weighting("gradnorm");
    cfg.gradnorm_alpha = 1.0;
    cfg.gradnorm_lr = 0.1;
    LossWeighting w(cfg, 2, 0.9, 0.95, 1e-8);
    EXPECT_EQ(w.weights(), (std::vector<double>{1.0, 1.0}));
    // Step 1 sets L_i(0) = (2, 1): r = (1, 1), targets = mean G = 0.5; G = (0.8, 0.2): w_0 -= 0.1 x 0.8 / 1, w_1 += 0.1
    // x 0.2 / 1, i.e. (0.92, 1.02), renormalised to sum 2.
    w.set_grad_norms({0.8, 0.2});
    w.update({6, 4}, {3, 4}, 0.0);
    EXPECT_NEAR(w.weights()[0], 2 * 0.92 / 1.94, 1e-15);
    EXPECT_NEAR(w.weights()[1], 2 * 1.02 / 1.94, 1e-15);
    EXPECT_EQ(w.multipliers({3, 4}), w.weights());
    // Step 2: L = (1, 1), L~ = (0.5, 1), r = (2/3, 4/3); G = (0.3, 0.3): targets (0.2, 0.4), so w_0 falls by 0.1 x 0.3
    // / w_0 and w_1 rises by 0.1 x 0.3 / w_1.
    const double w0 = 2 * 0.92 / 1.94, w1 = 2 * 1.02 / 1.94;
    w.set_grad_norms({0.3, 0.3});
    w.update({3, 4}, {3, 4}, 0.0);
    const double a = w0 - 0.1 * 0.3 / w0, b = w1 + 0.1 * 0.3 / w1;
    EXPECT_NEAR(w.weights()[0], 2 * a / (a + b), 1e-15);
    EXPECT_NEAR(w.weights()[1], 2 * b / (a + b), 1e-15);
}

TEST(LossWeighting, StateRoundTripsExactlyThroughJson) {
    for (const char* kind : {"uncertainty", "gradnorm", "dwa"}) {
        LossWeighting a(weighting(kind), 3, 0.9, 0.95, 1e-8), b(weighting(kind), 3, 0.9, 0.95, 1e-8);
        for (int t = 0; t < 5; ++t) {
            a.set_grad_norms({0.1 * t, 0.2, 0.3});
            a.update({1.0 + t, 2.0 / (t + 1), 0.3 * t}, {3, 2, 1}, 0.01);
        }
        b.load(nlohmann::json::parse(a.state().dump()));
        for (int t = 0; t < 3; ++t) {
            for (LossWeighting* x : {&a, &b}) {
                x->set_grad_norms({0.2, 0.1 * t, 0.3});
                x->update({0.7, 1.1, 2.3 + t}, {2, 2, 2}, 0.01);
            }
        }
        EXPECT_EQ(a.weights(), b.weights()) << kind;
        EXPECT_EQ(a.state(), b.state()) << kind;
        LossWeighting other(weighting("token_mean"), 3, 0.9, 0.95, 1e-8);
        EXPECT_THROW(other.load(a.state()), core::Error) << kind;
    }
}

}  // namespace
}  // namespace mt::train
