// Heartbeat files (operations.md §1): the fields, the background thread's beats while the main thread is busy (the
// phase it last set, a newer time, no step), the step end's beat, a training run's files, and an unwritable
// directory refused naming the path.
#include "train/heartbeat.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::testing::fresh_dir;
using mt::train::Heartbeat;
using mt::train::Phase;

namespace {

nlohmann::json read_beat(const std::string& path) {
    std::ifstream in(path);
    EXPECT_TRUE(in) << path;
    nlohmann::json j;
    in >> j;
    return j;
}

}  // namespace

TEST(Heartbeat, TheThreadBeatsWhileAStepRunsAndTheStepEndBeats) {
    const std::string dir = fresh_dir("beats");
    Heartbeat hb(dir, 3, 7, 0.02);
    EXPECT_EQ(hb.path(), dir + "/heartbeat/rank_3.json");
    nlohmann::json first = read_beat(hb.path());
    EXPECT_EQ(first.at("rank"), 3);
    EXPECT_EQ(first.at("step"), 7);
    EXPECT_EQ(first.at("phase"), "data");
    EXPECT_EQ(first.at("pid").get<int64_t>(), static_cast<int64_t>(getpid()));
    EXPECT_FALSE(first.at("host").get<std::string>().empty());
    // A long "backward" with no step end: the thread's beats report it, each newer than the last.
    hb.set_phase(Phase::backward);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const nlohmann::json busy = read_beat(hb.path());
    EXPECT_EQ(busy.at("phase"), "backward");
    EXPECT_EQ(busy.at("step"), 7);
    EXPECT_GT(busy.at("time").get<double>(), first.at("time").get<double>());
    hb.step_end(8, 1.25);
    const nlohmann::json done = read_beat(hb.path());
    EXPECT_EQ(done.at("step"), 8);
    EXPECT_EQ(done.at("step_time_s"), 1.25);
    EXPECT_EQ(done.at("phase"), "data");
}

TEST(Heartbeat, AnUnwritableDirectoryIsRefusedNamingIt) {
    const std::string dir = fresh_dir("blocked");
    std::ofstream(dir + "/heartbeat") << "a file where the directory goes\n";
    try {
        Heartbeat hb(dir, 0, 0, 1.0);
        FAIL() << "no error";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), mt::core::ExitCode::io);
        EXPECT_NE(std::string(e.what()).find(dir + "/heartbeat"), std::string::npos) << e.what();
    }
}

// A tiny run leaves rank 0's heartbeat at the last step; health.heartbeat_s = 0 writes none.
TEST(Heartbeat, ATrainingRunWritesIt) {
    const std::string dir = fresh_dir("run");
    mt::train::Trainer t(mt::testing::tiny_job(dir, {"train.steps=3", "health.heartbeat_s=0.05"}), false);
    t.run();
    const nlohmann::json j = read_beat(dir + "/run/heartbeat/rank_0.json");
    EXPECT_EQ(j.at("step"), 3);
    EXPECT_GT(j.at("step_time_s").get<double>(), 0.0);
    const std::string off = fresh_dir("off");
    mt::train::Trainer quiet(mt::testing::tiny_job(off, {"train.steps=1", "health.heartbeat_s=0"}), false);
    quiet.run();
    EXPECT_FALSE(std::ifstream(off + "/run/heartbeat/rank_0.json"));
}
