// Global-norm clipping checked on the update, not only the gradients: two trainer steps of the tiny model against an
// AdamW step written out here in f64 (global L2 norm over every gradient, scale clip / (norm + 1e-6) when the norm
// exceeds the clip, bias-corrected moments, decoupled weight decay on the weight matrices only; docs/training.md).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::train::Trainer;

namespace {

// Small eps so that the update depends on the gradient's scale: with eps near the clipped gradients' size, Adam's
// first step is far from lr * sign(g), and a missing or wrong clip factor moves the parameters by a visible part
// of lr (printed as "a wrong scale would move them by").
constexpr double kLr = 1e-2, kEps = 1e-4, kWeightDecay = 0.1, kBeta1 = 0.9, kBeta2 = 0.95;

using Values = std::vector<std::vector<double>>;  // per parameter, its elements

Values copy_all(const mt::nn::ParamTable& table, bool grads) {
    Values out;
    for (int i = 0; i < table.size(); ++i) {
        const mt::core::Tensor t = grads ? table.grad(i) : table.master(i);
        const float* p = t.data<float>();
        out.emplace_back(p, p + t.numel());
    }
    return out;
}

// The reference optimizer: its own moments, started at zero as the trainer's.
struct ReferenceAdamW {
    Values m, v;

    // The parameters after one step from `before` with gradients `g` scaled by `scale`, at 1-based step `step`.
    Values step(const mt::nn::ParamTable& table, const Values& before, const Values& g, double scale, int step) {
        if (m.empty()) {
            for (const auto& p : g) {
                m.emplace_back(p.size(), 0.0);
                v.emplace_back(p.size(), 0.0);
            }
        }
        const double bc1 = 1.0 - std::pow(kBeta1, step), bc2 = 1.0 - std::pow(kBeta2, step);
        Values after = before;
        for (size_t i = 0; i < g.size(); ++i) {
            // Decoupled decay on weight matrices (embedding, projections, head); the RMSNorm gains are vectors.
            const bool decayed = table.spec(static_cast<int>(i)).shape.size() >= 2;
            const double wd = decayed ? kWeightDecay : 0.0;
            for (size_t j = 0; j < g[i].size(); ++j) {
                const double gs = g[i][j] * scale;
                m[i][j] = kBeta1 * m[i][j] + (1.0 - kBeta1) * gs;
                v[i][j] = kBeta2 * v[i][j] + (1.0 - kBeta2) * gs * gs;
                after[i][j] =
                    before[i][j] * (1.0 - kLr * wd) - kLr * (m[i][j] / bc1) / (std::sqrt(v[i][j] / bc2) + kEps);
            }
        }
        return after;
    }
};

// max |a - b| / lr over every element: how far apart two parameter sets are, in units of one full update.
double worst_per_lr(const Values& a, const Values& b) {
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
        for (size_t j = 0; j < a[i].size(); ++j) worst = std::max(worst, std::abs(a[i][j] - b[i][j]) / kLr);
    return worst;
}

// Two steps with train.grad_clip = clip; each must be clipped iff `clipped`. The reference computed with the other
// choice of scale (what a broken clip would use) must differ from the trainer's parameters by far more than the
// tolerance, so the comparison is able to fail.
void check_clipped_steps(const std::string& dir, double clip, bool clipped) {
    Trainer trainer(mt::testing::tiny_job(dir,
                                          {"train.schedule=\"constant\"",
                                           "train.warmup_steps=0",
                                           "train.lr=" + fmt::format("{}", kLr),
                                           "train.eps=" + fmt::format("{}", kEps),
                                           "train.weight_decay=" + fmt::format("{}", kWeightDecay),
                                           "train.beta1=" + fmt::format("{}", kBeta1),
                                           "train.beta2=" + fmt::format("{}", kBeta2),
                                           "train.grad_clip=" + fmt::format("{}", clip)}),
                    false);
    const mt::nn::ParamTable& table = trainer.model().params();
    ASSERT_EQ(table.precision().master, mt::core::DType::f32);
    ReferenceAdamW reference, wrong;
    for (int step = 1; step <= 2; ++step) {
        const Values before = copy_all(table, false);
        const mt::train::StepResult r = trainer.train_step();
        ASSERT_DOUBLE_EQ(r.lr, kLr);
        // The trainer's gradients stay in the arena after the step (zeroed at the next one's start); clipping is
        // folded into the AdamW multiplier, so they are the unclipped ones.
        const Values g = copy_all(table, true);
        const Values after = copy_all(table, false);
        double sum_sq = 0.0;
        for (const auto& p : g)
            for (double x : p) sum_sq += x * x;
        const double norm = std::sqrt(sum_sq);
        EXPECT_NEAR(r.grad_norm, norm, 1e-9 * norm) << "step " << step;
        ASSERT_EQ(clip > 0 && norm > clip, clipped) << "step " << step << ": norm " << norm << ", clip " << clip;
        const double scale = clipped ? clip / (norm + 1e-6) : 1.0;
        const Values expected = reference.step(table, before, g, scale, step);
        // The other choice: no scaling where clipping is due, clip / norm where it is not.
        const Values other = wrong.step(table, before, g, clipped ? 1.0 : clip / (norm + 1e-6), step);
        const double err = worst_per_lr(after, expected), miss = worst_per_lr(other, expected);
        std::printf(
            "[ clip ] step %d: norm %.6f, clip %g, scale %.6f: max |param - reference| / lr = %.3e; the wrong scale "
            "would move them by %.3e\n",
            step,
            norm,
            clip,
            scale,
            err,
            miss);
        // f32 parameters and moments against f64: about 1e-6 of an update; a wrong scale is a sizeable fraction.
        EXPECT_LT(err, 1e-4) << "step " << step;
        EXPECT_GT(miss, 100 * 1e-4) << "step " << step << ": the test could not tell a wrong clip";
    }
}

}  // namespace

// A clip far below the initial gradient norm (a few units at a loss of ln 61): both steps are scaled.
TEST(GradClip, UpdateMatchesReferenceWhenClipping) {
    check_clipped_steps(mt::testing::fresh_dir("clip"), 0.05, true);
}

// A clip above the norm leaves the gradients alone (scale 1), and so does grad_clip = 0 (off).
TEST(GradClip, UpdateMatchesReferenceBelowTheClip) {
    check_clipped_steps(mt::testing::fresh_dir("below"), 100.0, false);
}

TEST(GradClip, ZeroTurnsClippingOff) {
    check_clipped_steps(mt::testing::fresh_dir("off"), 0.0, false);
}
