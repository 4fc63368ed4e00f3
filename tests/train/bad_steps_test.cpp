// Bad steps (operations.md §4, §8; docs/operations.md "Bad steps"): a gradient scaled by 1e6 at one data step is a
// gradient-norm spike; under `skip` the run then equals a run whose data never had that step, and the skipped step
// leaves every byte of the state unchanged; under `rollback` it equals a run whose data lost the window from the last
// checkpoint to the bad step, also after a resume; a non-finite step is re-run (a clean re-run is a transient fault,
// the run equals one without the fault); a reproducible one is skipped, or stops the run under `log`; more bad steps
// than health.max_spikes stop it with a checkpoint (exit 7).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/run_files.h"
#include "support/tiny_job.h"
#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace {

using mt::testing::file_bytes;
using mt::train::FaultInjection;
using mt::train::Trainer;

// The tiny job with the detector on from the fourth step and an action.
mt::train::JobConfig job(const std::string& dir, const std::string& action, std::vector<std::string> more = {}) {
    std::vector<std::string> o = {
        "train.steps=12", "health.spike_warmup=3", "health.spike_window=8", "health.spike_action=\"" + action + "\""};
    o.insert(o.end(), more.begin(), more.end());
    return mt::testing::tiny_job(dir, o);
}

std::vector<char> master_bytes(Trainer& t) {
    const mt::core::Tensor m = t.model().params().master_arena();
    const char* p = static_cast<const char*>(m.raw());
    return {p, p + m.nbytes()};
}

// The events of tiny_job's run in dir.
std::vector<nlohmann::json> events(const std::string& dir, const std::string& name) {
    return mt::testing::metrics_events(dir + "/run/metrics.jsonl", name);
}

}  // namespace

TEST(BadSteps, SkipEqualsARunWithoutThatDataStep) {
    const std::string a_dir = mt::testing::fresh_dir("a"), b_dir = mt::testing::fresh_dir("b");
    Trainer a(job(a_dir, "skip"), false);
    a.inject_fault({.data_step = 7, .grad_scale = 1e6});
    a.run();
    Trainer b(job(b_dir, "skip"), false);
    b.skip_data(7, 8);
    b.run();
    EXPECT_EQ(a.step(), 12);
    EXPECT_EQ(master_bytes(a), master_bytes(b)) << "the skipped run differs from the run without data step 7";
    const auto skipped = events(a_dir, "step_skipped");
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].at("reason"), "grad_spike");
    EXPECT_EQ(skipped[0].at("dropped_data"), nlohmann::json({7, 8}));
    EXPECT_EQ(events(a_dir, "grad_spike").size(), 1u);
    EXPECT_EQ(a.skipped_data(), (std::vector<std::pair<int64_t, int64_t>>{{7, 8}}));
    EXPECT_EQ(a.data_step(7), 8);
    EXPECT_EQ(a.data_step(6), 6);
}

// The MoE model, so that the balancer's counts are state too: the checkpoint file written before the skipped step
// (weights, moments, balancer) equals, byte for byte, the one written after it.
TEST(BadSteps, ASkippedStepLeavesEveryByteOfTheStateUnchanged) {
    const std::string dir = mt::testing::fresh_dir("x");
    Trainer t(job(dir, "skip", {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"}),
              false);
    for (int i = 0; i < 6; ++i) t.train_step();
    const std::string file = dir + "/run/checkpoints/step_00000006/rank_00000.safetensors";
    t.save_checkpoint();
    const std::string before = file_bytes(file);
    ASSERT_FALSE(before.empty());
    const double scale = t.loss_scale();
    t.inject_fault({.data_step = t.data_step(6), .grad_scale = 1e6});
    const mt::train::StepResult r = t.train_step();
    EXPECT_EQ(r.bad_step, "skipped");
    EXPECT_TRUE(r.grad_spike.spike);
    EXPECT_EQ(t.step(), 6) << "the step counter moved";
    EXPECT_EQ(t.loss_scale(), scale);
    t.save_checkpoint();
    EXPECT_TRUE(file_bytes(file) == before) << "a skipped step changed the saved state";
}

TEST(BadSteps, RollbackEqualsARunWithoutTheWindowAlsoAfterAResume) {
    const std::string a_dir = mt::testing::fresh_dir("a"), b_dir = mt::testing::fresh_dir("b");
    const std::vector<std::string> more = {"train.steps=16", "checkpoint.every_steps=4", "checkpoint.keep_last=10"};
    Trainer b(job(b_dir, "rollback", more), false);
    b.skip_data(8, 10);
    b.run();
    {
        Trainer a(job(a_dir, "rollback", more), false);
        a.inject_fault({.data_step = 9, .grad_scale = 1e6});
        a.run();
        const auto rb = events(a_dir, "rollback");
        ASSERT_EQ(rb.size(), 1u);
        EXPECT_EQ(rb[0].at("resumed_step"), 8);
        EXPECT_EQ(rb[0].at("dropped_data"), nlohmann::json({8, 10}));
        EXPECT_EQ(master_bytes(a), master_bytes(b)) << "the rolled-back run differs from the run without the window";
    }
    // The checkpoints after the rollback record the dropped window: the last one dropped, a resume from step 12
    // reads past the window and ends where the run without it ends.
    const std::string root = a_dir + "/run/checkpoints";
    const auto manifest = mt::train::checkpoint_open(root + "/step_00000012").manifest();
    EXPECT_EQ(manifest.at("health").at("skipped_data"), nlohmann::json({{8, 10}}));
    std::filesystem::remove_all(root + "/step_00000016");
    Trainer resumed(job(a_dir, "rollback", more), false);
    ASSERT_TRUE(resumed.resume_latest());
    EXPECT_EQ(resumed.step(), 12);
    EXPECT_EQ(resumed.data_step(12), 14);
    resumed.run();
    EXPECT_EQ(master_bytes(resumed), master_bytes(b)) << "the resumed run differs from the run without the window";
}

TEST(BadSteps, ATransientNonFiniteStepIsReRunClean) {
    const std::string a_dir = mt::testing::fresh_dir("a"), b_dir = mt::testing::fresh_dir("b");
    Trainer a(job(a_dir, "skip"), false);
    a.inject_fault({.data_step = 5, .nonfinite = true, .times = 1});
    a.run();
    Trainer b(job(b_dir, "skip"), false);
    b.run();
    EXPECT_EQ(master_bytes(a), master_bytes(b)) << "the re-run step differs from the step without a fault";
    ASSERT_EQ(events(a_dir, "transient_fault").size(), 1u);
    EXPECT_TRUE(events(a_dir, "step_skipped").empty());
}

TEST(BadSteps, AReproducibleNonFiniteStepIsSkippedOrStopsTheRun) {
    const std::string a_dir = mt::testing::fresh_dir("a"), b_dir = mt::testing::fresh_dir("b");
    Trainer a(job(a_dir, "skip"), false);
    a.inject_fault({.data_step = 5, .nonfinite = true, .times = 2});
    a.run();
    Trainer b(job(b_dir, "skip"), false);
    b.skip_data(5, 6);
    b.run();
    EXPECT_EQ(master_bytes(a), master_bytes(b));
    ASSERT_EQ(events(a_dir, "nonfinite").size(), 1u);
    ASSERT_EQ(events(a_dir, "step_skipped").size(), 1u);
    EXPECT_EQ(events(a_dir, "step_skipped")[0].at("reason"), "nonfinite");

    const std::string c_dir = mt::testing::fresh_dir("c");
    Trainer c(job(c_dir, "log"), false);
    c.inject_fault({.data_step = 5, .nonfinite = true, .times = 2});
    try {
        c.run();
        FAIL() << "a reproducible non-finite step under log did not stop the run";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), mt::core::ExitCode::health);
    }
}

TEST(BadSteps, TooManySpikesStopTheRunWithACheckpoint) {
    const std::string dir = mt::testing::fresh_dir("x");
    // Every step whose gradient norm lies above its window's median is a spike at z = 1e-6: a few steps in, the
    // third skipped one is over health.max_spikes = 2.
    Trainer t(job(dir, "skip", {"train.steps=40", "health.spike_z=1e-6", "health.max_spikes=2"}), false);
    try {
        t.run();
        FAIL() << "the run did not stop";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), mt::core::ExitCode::health);
        EXPECT_NE(std::string(e.what()).find("health.max_spikes = 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(events(dir, "step_skipped").size(), 3u);
    EXPECT_EQ(events(dir, "health_stop").size(), 1u);
    EXPECT_TRUE(mt::train::checkpoint_find_latest(dir + "/run/checkpoints").has_value());
}
