// The multi-step alarms (operations.md §5, §8 "every alarm fired by a constructed case and silent on a healthy tiny
// run"): expert-load drift, memory pressure, throughput drop and straggler each fire once when their constructed
// condition starts (not again while it holds, again after it cleared) and stay silent on the healthy version of the
// same sequence; a tiny MoE training run raises none of them and logs every kind's counter.
#include "train/alarms.h"

#include <gtest/gtest.h>

#include <fstream>

#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::train::AlarmConfig;
using mt::train::AlarmMonitor;
using mt::train::kTrainerAlarmKinds;

TEST(Alarms, TotalVariationByHand) {
    EXPECT_DOUBLE_EQ(mt::train::total_variation({1, 1, 1, 1}, {1, 1, 1, 1}), 0.0);
    EXPECT_DOUBLE_EQ(mt::train::total_variation({1, 0}, {0, 1}), 1.0);
    EXPECT_DOUBLE_EQ(mt::train::total_variation({3, 1}, {1, 1}), 0.25);  // 0.5 (|0.75-0.5| + |0.25-0.5|)
}

TEST(Alarms, ExpertLoadDriftFiresOnceWhenTheLoadShifts) {
    AlarmMonitor m(AlarmConfig{.drift_tv = 0.2, .drift_window = 5, .drift_ema = 0.01, .warmup = 10});
    int fired = 0;
    for (int s = 0; s < 40; ++s) fired += static_cast<int>(m.observe_expert_loads(2, {25, 25, 25, 25}).size());
    EXPECT_EQ(fired, 0) << "a steady load raised a drift alarm";
    // Every row to expert 0 from now on: the recent window leaves the reference (TV -> 0.75) within a few steps.
    std::vector<mt::train::Alarm> got;
    for (int s = 0; s < 20; ++s) {
        auto a = m.observe_expert_loads(2, {100, 0, 0, 0});
        got.insert(got.end(), a.begin(), a.end());
    }
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].kind, "expert_load_drift");
    EXPECT_EQ(got[0].fields.at("layer"), 2);
    EXPECT_GT(got[0].fields.at("tv").get<double>(), 0.2);
    EXPECT_EQ(m.totals().at("expert_load_drift"), 1);
}

TEST(Alarms, MemoryPressureAboveTheFraction) {
    AlarmMonitor m(AlarmConfig{.memory_fraction = 0.95});
    EXPECT_TRUE(m.observe_memory(0.90).empty());
    EXPECT_EQ(m.observe_memory(0.97).size(), 1u);
    EXPECT_TRUE(m.observe_memory(0.98).empty()) << "an alarm per step while it holds";
    EXPECT_TRUE(m.observe_memory(0.50).empty());
    EXPECT_EQ(m.observe_memory(0.96).size(), 1u) << "not raised again after it cleared";
    EXPECT_EQ(m.totals().at("memory_pressure"), 2);
}

TEST(Alarms, ThroughputDropBelowTheMedian) {
    AlarmMonitor m(AlarmConfig{.throughput_ratio = 0.7, .throughput_window = 20, .warmup = 5});
    int fired = 0;
    // +-10% noise around 1000 tokens/s is healthy.
    for (int s = 0; s < 60; ++s)
        fired += static_cast<int>(m.observe_throughput(1000.0 * (s % 3 == 0 ? 0.9 : 1.1)).size());
    EXPECT_EQ(fired, 0);
    const auto a = m.observe_throughput(500.0);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].kind, "throughput_drop");
    EXPECT_NEAR(a[0].fields.at("median").get<double>(), 1100.0, 1e-9);
}

TEST(Alarms, StragglerRank) {
    AlarmMonitor m(AlarmConfig{.straggler_ratio = 1.2, .straggler_window = 3});
    // One slow step of rank 1 is noise: its mean over three steps stays within 1.2 x the median.
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.05, 0.98, 1.1}).empty());
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.5, 1.0, 1.0}).empty());
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.0, 1.0}).empty());
    // Rank 2 slow step after step: named once its mean is above (1.0, 1.0, 1.5 -> 1.17; then 1.33).
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.5, 1.0}).empty());
    const auto a = m.observe_rank_times({1.0, 1.0, 1.5, 1.0});
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].fields.at("rank"), 2);
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.5, 1.0}).empty()) << "an alarm per step while it holds";
}

// The trainer shares the ranks' means once per train line: each observation covers metrics.every steps, and the
// window is judged once the observations cover straggler_window steps, dropping the oldest that are not needed.
TEST(Alarms, StragglerWindowCountsSteps) {
    AlarmMonitor m(AlarmConfig{.straggler_ratio = 1.2, .straggler_window = 4});
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.5, 1.0}, 2).empty()) << "2 steps of 4";
    const auto a = m.observe_rank_times({1.0, 1.0, 1.5, 1.0}, 2);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].fields.at("rank"), 2);
    EXPECT_NE(a[0].detail.find("last 4 steps"), std::string::npos) << a[0].detail;
    // Four healthy steps in one observation replace both slow ones: the alarm clears, and fires again on the next.
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.0, 1.0}, 4).empty());
    EXPECT_TRUE(m.observe_rank_times({1.0, 1.0, 1.4, 1.0}, 1).empty()) << "(4 x 1.0 + 1.4) / 5 = 1.08";
    EXPECT_EQ(m.observe_rank_times({1.0, 1.0, 2.0, 1.0}, 3).size(), 1u) << "(1.4 + 3 x 2.0) / 4 = 1.85";
}

TEST(Alarms, SilentOnAHealthyTinyMoeRun) {
    const std::string dir = mt::testing::fresh_dir("x");
    mt::train::Trainer t(mt::testing::tiny_job(dir,
                                               {"train.steps=40",
                                                "moe.enabled=true",
                                                "moe.num_experts=4",
                                                "moe.top_k=2",
                                                "moe.expert_ffn_dim=16",
                                                "health.spike_warmup=5",
                                                "health.spike_action=\"off\"",
                                                "health.drift_window=5",
                                                "health.throughput_drop=0"}),
                         false);
    t.run();
    std::ifstream in(dir + "/run/metrics.jsonl");
    int train_lines = 0;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        EXPECT_FALSE(j.at("kind") == "event" && j.contains("alarm")) << line;
        if (j.at("kind") != "train") continue;
        ++train_lines;
        for (const char* kind : kTrainerAlarmKinds) EXPECT_TRUE(j.contains(std::string("alarms/") + kind)) << kind;
    }
    EXPECT_EQ(train_lines, 40);
}
