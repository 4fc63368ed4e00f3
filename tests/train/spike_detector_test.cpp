// The spike detector (operations.md §4, §8 "the detector on a scripted loss sequence"): median and MAD by hand, the
// z-score and decision of each step of a scripted sequence, warm-up, a spike kept out of the window, and a training
// run in which a learning rate raised by a factor 1000 at one step raises a loss and gradient-norm spike event.
#include "train/spike_detector.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::train::median_mad;
using mt::train::SpikeSeries;

TEST(SpikeDetector, MedianAndMadByHand) {
    EXPECT_EQ(median_mad({3.0, 1.0, 2.0}), (std::pair<double, double>{2.0, 1.0}));
    // {1, 2, 4, 10}: median 3; deviations {2, 1, 1, 7}, their median 1.5.
    EXPECT_EQ(median_mad({10.0, 1.0, 4.0, 2.0}), (std::pair<double, double>{3.0, 1.5}));
    EXPECT_EQ(median_mad({}), (std::pair<double, double>{0.0, 0.0}));
}

// Window 4, threshold 6, warm-up 2 (z's denominator 1.4826 MAD + 1e-6 |median|). Values 2.0, 2.1, 1.9, 2.0 fill
// it; then 2.05 (median 2.0, MAD 0.05: z = 0.674), 9.0 (the window {2.1, 1.9, 2.0, 2.05}: median 2.025, MAD 0.05,
// z = 94.1: a spike, kept out), 2.0 (judged against the same window: z = -0.337).
TEST(SpikeDetector, ScriptedSequence) {
    SpikeSeries s(4, 6.0, 2);
    EXPECT_FALSE(s.observe(2.0).spike);  // warm-up
    EXPECT_FALSE(s.observe(2.1).spike);  // warm-up
    const auto third = s.observe(1.9);   // fewer than 3 values before it: not judged
    EXPECT_FALSE(third.spike);
    EXPECT_EQ(third.z, 0.0);
    EXPECT_NEAR(s.observe(2.0).z, 0.0, 1e-9);  // window {2.0, 2.1, 1.9}: median 2.0
    const auto a = s.observe(2.05);
    EXPECT_FALSE(a.spike);
    EXPECT_NEAR(a.median, 2.0, 1e-12);
    EXPECT_NEAR(a.mad, 0.05, 1e-12);
    EXPECT_NEAR(a.z, 0.05 / (1.4826 * 0.05 + 1e-6 * 2.0), 1e-12);  // eps = 1e-6 |median|
    const auto b = s.observe(9.0);
    EXPECT_TRUE(b.spike);
    EXPECT_NEAR(b.median, 2.025, 1e-12);
    EXPECT_NEAR(b.mad, 0.05, 1e-12);
    EXPECT_NEAR(b.z, (9.0 - 2.025) / (1.4826 * 0.05 + 1e-6 * 2.025), 1e-9);
    const auto c = s.observe(2.0);  // the spike did not enter the window
    EXPECT_FALSE(c.spike);
    EXPECT_NEAR(c.median, 2.025, 1e-12);
    EXPECT_NEAR(c.z, (2.0 - 2.025) / (1.4826 * 0.05 + 1e-6 * 2.025), 1e-12);
}

// A flat window (MAD 0): a tiny change is not a spike by division by zero, a large one is.
TEST(SpikeDetector, FlatWindow) {
    SpikeSeries s(10, 6.0, 0);
    for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.observe(1.0).spike);
    EXPECT_TRUE(s.observe(2.0).spike);
}

// The trainer's side: every train line carries the z-scores and the counters; with a threshold of 1e-6 every step
// whose gradient norm lies above its window's median is a spike, so a 30-step run writes grad_spike events, each
// counted; with health.spike_action = "off" nothing.
TEST(SpikeDetector, ATrainingRunWritesTheEventsAndCounters) {
    for (const bool on : {true, false}) {
        const std::string dir = mt::testing::fresh_dir(on ? "on" : "off");
        mt::train::Trainer t(
            mt::testing::tiny_job(dir,
                                  {"train.steps=30",
                                   "health.spike_warmup=2",
                                   "health.spike_window=8",
                                   "health.spike_z=1e-6",
                                   "health.max_spikes=0",
                                   std::string("health.spike_action=") + (on ? "\"log\"" : "\"off\"")}),
            false);
        t.run();
        int events = 0, lines = 0;
        int64_t counted = 0;
        std::ifstream in(dir + "/run/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line);
            if (j.at("kind") == "event" && j.at("event") == "grad_spike") {
                ++events;
                EXPECT_GT(j.at("z").get<double>(), 1e-6);
            }
            if (j.at("kind") != "train") continue;
            ++lines;
            EXPECT_EQ(j.contains("health/grad_norm_z"), on);
            if (on) counted = j.at("health/grad_spikes_total").get<int64_t>();
        }
        EXPECT_EQ(lines, 30);
        if (on) {
            EXPECT_GT(events, 0);
            EXPECT_EQ(counted, events);
        } else {
            EXPECT_EQ(events, 0);
        }
    }
}
