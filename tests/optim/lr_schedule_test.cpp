// Learning-rate schedules against tables of hand-computed values (docs/training.md), including the edge steps:
// step 0, the end of warmup, the first step after it, the WSD decay start, the last step and steps past the end.
// Every expected value is written out from the formula in the comment above its table, never by calling LrSchedule.
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::optim::LrSchedule;
using mt::optim::ScheduleKind;

namespace {

struct Row {
    int64_t step;
    double lr;
};

// Checks every row to 1e-12 relative (the schedule is f64 arithmetic; the tables carry 16 digits) and prints the
// worst relative error so a run shows how close the code is to the tables.
void check_table(const char* what, const LrSchedule& s, const std::vector<Row>& rows) {
    double worst = 0.0;
    for (const Row& r : rows) {
        const double got = s.at(r.step);
        const double rel = r.lr == 0.0 ? std::abs(got) : std::abs(got - r.lr) / std::abs(r.lr);
        worst = std::max(worst, rel);
        EXPECT_LE(rel, 1e-12) << what << ": step " << r.step << " gives " << got << ", expected " << r.lr;
    }
    std::printf("[ lr ] %s: %zu steps, worst relative error %.3e\n", what, rows.size(), worst);
}

}  // namespace

// Warmup is lr (s + 1) / W for s < W, the same for every schedule, so step W - 1 is the first at the peak.
// After it, cosine: p = min(1, (s - W) / (N - W)), lr(s) = min + (lr - min) (1 + cos(pi p)) / 2, min = lr * ratio.
// lr = 1e-3, ratio 0.1 (min 1e-4), W = 2, N = 8: span 6, so p = k / 6 and cos takes the values of pi / 6 steps.
// The last step (7) has p = 5/6: cosine (as Hugging Face's) reaches min_lr one step past the end, not at step 7.
TEST(LrSchedule, CosineWithWarmup) {
    const LrSchedule s{
        .kind = ScheduleKind::cosine, .lr = 1e-3, .min_lr_ratio = 0.1, .warmup_steps = 2, .total_steps = 8};
    check_table("cosine W=2 N=8 ratio=0.1",
                s,
                {
                    {0, 5e-4},                   // 1e-3 * 1/2: step 0 already trains
                    {1, 1e-3},                   // 1e-3 * 2/2: warmup ends at the peak
                    {2, 1e-3},                   // p = 0, cos 0 = 1
                    {3, 9.397114317029974e-4},   // p = 1/6: 1e-4 + 4.5e-4 (1 + sqrt(3)/2)
                    {4, 7.75e-4},                // p = 1/3: 1e-4 + 4.5e-4 * 1.5
                    {5, 5.5e-4},                 // p = 1/2: 1e-4 + 4.5e-4
                    {6, 3.25e-4},                // p = 2/3: 1e-4 + 4.5e-4 * 0.5
                    {7, 1.6028856829700258e-4},  // p = 5/6 (last step): 1e-4 + 4.5e-4 (1 - sqrt(3)/2)
                    {8, 1e-4},                   // p = 1: min_lr
                    {50, 1e-4},                  // p clamps at 1
                });
}

// min_lr_ratio 0 decays to zero; W = 0 starts at the peak. lr = 1e-3, N = 4: p = s / 4.
// min_lr_ratio 1 keeps the peak throughout.
TEST(LrSchedule, CosineMinLrRatioEnds) {
    const LrSchedule zero{
        .kind = ScheduleKind::cosine, .lr = 1e-3, .min_lr_ratio = 0.0, .warmup_steps = 0, .total_steps = 4};
    check_table("cosine W=0 N=4 ratio=0",
                zero,
                {
                    {0, 1e-3},                   // p = 0
                    {1, 8.535533905932737e-4},   // p = 1/4: 5e-4 (1 + sqrt(2)/2)
                    {2, 5e-4},                   // p = 1/2
                    {3, 1.4644660940672624e-4},  // p = 3/4 (last step): 5e-4 (1 - sqrt(2)/2)
                    {4, 0.0},                    // p = 1
                });
    const LrSchedule one{
        .kind = ScheduleKind::cosine, .lr = 2e-3, .min_lr_ratio = 1.0, .warmup_steps = 0, .total_steps = 10};
    check_table("cosine ratio=1", one, {{0, 2e-3}, {5, 2e-3}, {9, 2e-3}});
    // A one-step run (span max(1, N - W) = 1): its only step is at p = 0, the peak.
    const LrSchedule single{.kind = ScheduleKind::cosine, .lr = 1e-3, .min_lr_ratio = 0.1, .total_steps = 1};
    check_table("cosine N=1", single, {{0, 1e-3}});
}

// WSD: warmup, then lr until decay_start = N - D with D = ceil(decay_ratio N) decay steps, then
// lr(s) = lr + (min - lr) q, q = min(1, (s - decay_start + 1) / D): the decay start is already one step down and the
// last step is exactly min_lr. lr = 1e-3, ratio 0.1 (min 1e-4), W = 2, N = 12, decay_ratio 0.25: D = 3, start 9.
TEST(LrSchedule, WsdWithWarmup) {
    LrSchedule s{.kind = ScheduleKind::wsd,
                 .lr = 1e-3,
                 .min_lr_ratio = 0.1,
                 .warmup_steps = 2,
                 .total_steps = 12,
                 .decay_ratio = 0.25};
    const std::vector<Row> rows = {
        {0, 5e-4},   // warmup 1/2
        {1, 1e-3},   // warmup end
        {2, 1e-3},   // stable
        {8, 1e-3},   // the last stable step
        {9, 7e-4},   // decay start, q = 1/3: 1e-3 - 9e-4 / 3
        {10, 4e-4},  // q = 2/3
        {11, 1e-4},  // last step, q = 1: min_lr
        {12, 1e-4},  // q clamps at 1
        {40, 1e-4},
    };
    check_table("wsd W=2 N=12 decay_ratio=0.25", s, rows);
    // decay_ratio 0.2: 0.2 * 12 = 2.4 rounds up to the same D = 3, so the same table.
    s.decay_ratio = 0.2;
    check_table("wsd W=2 N=12 decay_ratio=0.2 (ceil)", s, rows);
}

// decay_ratio 0 never decays (a constant schedule with warmup); decay_ratio 1 decays from step 0: D = N = 4,
// lr = 1e-3, ratio 0.5 (min 5e-4), q = (s + 1) / 4.
TEST(LrSchedule, WsdDecayRatioEnds) {
    const LrSchedule none{.kind = ScheduleKind::wsd,
                          .lr = 1e-3,
                          .min_lr_ratio = 0.1,
                          .warmup_steps = 2,
                          .total_steps = 10,
                          .decay_ratio = 0.0};
    check_table("wsd decay_ratio=0", none, {{0, 5e-4}, {1, 1e-3}, {2, 1e-3}, {9, 1e-3}});
    const LrSchedule all{.kind = ScheduleKind::wsd,
                         .lr = 1e-3,
                         .min_lr_ratio = 0.5,
                         .warmup_steps = 0,
                         .total_steps = 4,
                         .decay_ratio = 1.0};
    check_table("wsd decay_ratio=1 ratio=0.5", all, {{0, 8.75e-4}, {1, 7.5e-4}, {2, 6.25e-4}, {3, 5e-4}});
}

// decay_ratio N that is an integer in decimal but not in binary: 0.07 * 100 is 7.000000000000001 in f64, whose
// ceil would give D = 8 and start the decay a step early. D must be 7: start 93, q = (s - 92) / 7, min 0.
TEST(LrSchedule, WsdDecayStepsIgnoreBinaryRounding) {
    const LrSchedule s{.kind = ScheduleKind::wsd,
                       .lr = 1e-3,
                       .min_lr_ratio = 0.0,
                       .warmup_steps = 0,
                       .total_steps = 100,
                       .decay_ratio = 0.07};
    check_table("wsd N=100 decay_ratio=0.07",
                s,
                {
                    {92, 1e-3},                  // the last stable step
                    {93, 8.571428571428571e-4},  // decay start: 1e-3 (1 - 1/7)
                    {96, 4.285714285714286e-4},  // 1e-3 (1 - 4/7)
                    {99, 0.0},                   // last step
                });
}

// Constant: warmup, then lr; min_lr_ratio does not apply. lr = 3e-4, W = 3.
TEST(LrSchedule, ConstantWithWarmup) {
    const LrSchedule s{
        .kind = ScheduleKind::constant, .lr = 3e-4, .min_lr_ratio = 0.1, .warmup_steps = 3, .total_steps = 10};
    check_table("constant W=3", s, {{0, 1e-4}, {1, 2e-4}, {2, 3e-4}, {3, 3e-4}, {9, 3e-4}, {1000, 3e-4}});
    // W = 1: the first step is already at the peak.
    const LrSchedule one{.kind = ScheduleKind::constant, .lr = 3e-4, .warmup_steps = 1, .total_steps = 10};
    check_table("constant W=1", one, {{0, 3e-4}, {1, 3e-4}});
}

TEST(LrSchedule, KindNames) {
    ScheduleKind k = ScheduleKind::constant;
    ASSERT_TRUE(mt::optim::schedule_kind_from_name("cosine", &k));
    EXPECT_EQ(k, ScheduleKind::cosine);
    ASSERT_TRUE(mt::optim::schedule_kind_from_name("wsd", &k));
    EXPECT_EQ(k, ScheduleKind::wsd);
    ASSERT_TRUE(mt::optim::schedule_kind_from_name("constant", &k));
    EXPECT_EQ(k, ScheduleKind::constant);
    EXPECT_FALSE(mt::optim::schedule_kind_from_name("linear", &k));
    EXPECT_EQ(k, ScheduleKind::constant) << "an unknown name leaves the kind alone";
}

// The trainer takes every schedule key from [train]: the lr of each step it reports follows the WSD table for
// lr = 1e-2, W = 1, N = 6, decay_ratio 0.5 (D = 3, start 3), min_lr_ratio 0.5 (min 5e-3).
TEST(LrSchedule, TrainerFollowsTheConfiguredSchedule) {
    const std::string dir = mt::testing::fresh_dir("wsd");
    mt::train::Trainer trainer(mt::testing::tiny_job(dir,
                                                     {"train.steps=6",
                                                      "train.lr=1e-2",
                                                      "train.warmup_steps=1",
                                                      "train.schedule=\"wsd\"",
                                                      "train.decay_ratio=0.5",
                                                      "train.min_lr_ratio=0.5"}),
                               false);
    const std::vector<double> expected = {1e-2, 1e-2, 1e-2, 8.333333333333334e-3, 6.666666666666667e-3, 5e-3};
    for (size_t i = 0; i < expected.size(); ++i)
        EXPECT_NEAR(trainer.train_step().lr, expected[i], 1e-15) << "step " << i;
}
