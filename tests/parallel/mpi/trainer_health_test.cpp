// Bad steps and alarms under mpirun (docs/operations.md "Bad steps", "Alarms"): every rank judges the same reduced
// loss and gradient norm, so a gradient spike at one data step is skipped by all ranks alike and the data-parallel
// run equals the one-process run that skipped it; a rank that sleeps in every step is named by a straggler alarm.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "support/run_files.h"
#include "train/trainer.h"

using mt::testing::data_dir;
using mt::testing::mpi_job;
using mt::testing::shared_dir;
using mt::train::Trainer;

namespace {

std::vector<nlohmann::json> events(const std::string& run_dir, const std::string& name) {
    return mt::testing::metrics_events(run_dir + "/metrics.jsonl", name);
}

}  // namespace

TEST(TrainerHealth, ASkippedSpikeUnderDataParallelEqualsOneProcess) {
    auto& world = mt::parallel::dist_world();
    const std::string data = data_dir(), run = shared_dir("dp"), one = shared_dir("one");
    const std::vector<std::string> o = {"train.steps=12", "health.spike_warmup=3", "health.spike_action=\"skip\""};
    Trainer dp(mpi_job(data, run, o), false);
    dp.inject_fault({.data_step = 7, .grad_scale = 1e6});
    dp.run();
    EXPECT_EQ(dp.skipped_data(), (std::vector<std::pair<int64_t, int64_t>>{{7, 8}}));
    // One process with the same global batch: dp times the micro-batches.
    auto self = mt::parallel::comm_make_self();
    Trainer single(mpi_job(data,
                           one + "/r" + std::to_string(world.rank()),
                           {"train.steps=12",
                            "health.spike_warmup=3",
                            "health.spike_action=\"skip\"",
                            "parallel.dp=1",
                            "train.grad_accum=" + std::to_string(2 * world.size())}),
                   false,
                   self.get());
    single.inject_fault({.data_step = 7, .grad_scale = 1e6});
    single.run();
    EXPECT_EQ(single.skipped_data(), dp.skipped_data());
    const double a = single.evaluate(), b = dp.evaluate();
    EXPECT_LT(std::abs(a - b) / std::abs(a), 1e-5) << "validation loss: one process " << a << ", dp " << b;
    if (world.rank() == 0) {
        EXPECT_EQ(events(run, "step_skipped").size(), 1u);
    }
}

TEST(TrainerHealth, AStragglerRankIsNamed) {
    auto& world = mt::parallel::dist_world();
    const std::string data = data_dir(), run = shared_dir("s");
    Trainer t(mpi_job(data, run, {"train.steps=8", "health.straggler_ratio=1.5", "health.straggler_window=3"}), false);
    const int slow = world.size() - 1;
    t.inject_fault({.straggler_rank = slow, .straggler_seconds = 0.2});
    t.run();
    if (world.rank() != 0) return;
    // On an oversubscribed machine another rank may be slow for a step too; the sleeping rank is named exactly once.
    int named = 0;
    for (const auto& e : events(run, "straggler")) {
        EXPECT_EQ(e.at("alarm"), true);
        named += e.at("rank") == slow ? 1 : 0;
    }
    EXPECT_EQ(named, 1) << "one alarm when the straggling starts, not one per step";
}
