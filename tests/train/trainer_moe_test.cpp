// Trainer with MoE layers: the routing-collapse alarm (moe.md §4) fires in a run forced to collapse — an event line
// in metrics.jsonl, the alarm counter, and with moe.alarm.action = "stop" a checkpoint and exit code 7 — and stays
// silent in a balanced run; the per-layer metrics reach the JSONL.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/tiny_job.h"
#include "train/checkpoint_io.h"
#include "train/trainer.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::testing::fresh_dir;
using mt::testing::tiny_job;
using mt::train::Trainer;

namespace {

// Layer 1 is an MoE layer of 6 experts, top 2; the alarm watches from step 2 with a window of 3 steps.
std::vector<std::string> moe_job(const std::string& balance, const std::string& action, int64_t steps) {
    return {"moe.enabled=true",
            "moe.num_experts=6",
            "moe.top_k=2",
            "moe.expert_ffn_dim=16",
            "moe.balance=\"" + balance + "\"",
            "moe.alarm.start_step=2",
            "moe.alarm.window=3",
            "moe.alarm.action=\"" + action + "\"",
            "moe.log_loads_every=2",
            "train.steps=" + std::to_string(steps)};
}

// Collapse by construction: zero router weights give every expert the score 0.5, so every token picks experts 0 and
// 1 (ties go to the lower index); with no balancing and a learning rate too small to break the ties, it stays so.
void force_collapse(Trainer& trainer) {
    auto& table = trainer.model().params();
    const int router = table.find("layers.1.moe.router.weight");
    ASSERT_GE(router, 0);
    table.master(router).zero();
    table.refresh_params_from_master();
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::ifstream in(path);
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
}

}  // namespace

TEST(TrainerMoe, CollapseAlarmStopsWithCheckpointAndEvent) {
    const std::string dir = fresh_dir("stop");
    auto job = moe_job("none", "stop", 20);
    job.push_back("train.lr=1e-12");
    Trainer trainer(tiny_job(dir, job), false);
    force_collapse(trainer);
    try {
        trainer.run();
        FAIL() << "expected the collapse alarm to stop the run";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::health) << e.what();
        EXPECT_NE(std::string(e.what()).find("routing collapse at step 4"), std::string::npos) << e.what();
    }
    // Steps 2, 3 and 4 collapsed: the alarm fires at step 4, after which a checkpoint of step 4 exists.
    EXPECT_EQ(trainer.step(), 4);
    EXPECT_EQ(trainer.moe_alarms_total(), 1);
    const auto latest = mt::train::checkpoint_find_latest(dir + "/run/checkpoints");
    ASSERT_TRUE(latest.has_value());
    EXPECT_NE(latest->find("step_00000004"), std::string::npos) << *latest;
    int events = 0;
    for (const auto& j : read_jsonl(dir + "/run/metrics.jsonl")) {
        if (j.at("kind") != "event" || j.value("event", "") != "moe_collapse") continue;
        ++events;
        EXPECT_EQ(j.at("step"), 4);
        EXPECT_EQ(j.at("layer"), 1);
        EXPECT_EQ(j.at("reason"), "load_var");
        EXPECT_NE(j.at("detail").get<std::string>().find("load_var"), std::string::npos) << j.dump();
    }
    EXPECT_EQ(events, 1);
}

TEST(TrainerMoe, CollapseAlarmLogsEveryWindowAndBalancedRunHasNone) {
    const std::string dir = fresh_dir("log");
    {
        auto job = moe_job("none", "log", 10);
        job.push_back("train.lr=1e-12");
        job.push_back("run.dir=\"" + dir + "/collapsed\"");
        Trainer trainer(tiny_job(dir, job), false);
        force_collapse(trainer);
        trainer.run();
        EXPECT_EQ(trainer.step(), 10);
        EXPECT_EQ(trainer.moe_alarms_total(), 3);  // steps 4, 7 and 10
    }
    auto job = moe_job("quantile", "stop", 12);
    job.push_back("run.dir=\"" + dir + "/balanced\"");
    Trainer trainer(tiny_job(dir, job), false);
    trainer.run();
    EXPECT_EQ(trainer.moe_alarms_total(), 0);
    // The per-layer metrics of moe.md §4 are in every train line, the loads every moe.log_loads_every steps.
    int train_lines = 0;
    for (const auto& j : read_jsonl(dir + "/balanced/metrics.jsonl")) {
        if (j.at("kind") != "train") continue;
        ++train_lines;
        for (const char* key : {"moe/max_vio/l01",
                                "moe/load_var/l01",
                                "moe/drop_rate/l01",
                                "moe/bias_range/l01",
                                "moe/token_entropy/l01",
                                "moe/n_eff/l01",
                                "moe/max_vio"})
            EXPECT_TRUE(j.contains(key)) << key << " missing at step " << j.at("step");
        EXPECT_EQ(j.contains("moe/load/l01"), j.at("step").get<int64_t>() % 2 == 0);
        if (j.contains("moe/load/l01")) {
            EXPECT_EQ(j.at("moe/load/l01").size(), 6u);
        }
        EXPECT_FALSE(j.contains("moe/max_vio/l00"));  // layer 0 is dense
    }
    EXPECT_EQ(train_lines, 12);
}
