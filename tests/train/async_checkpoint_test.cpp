// Asynchronous checkpoints (docs/operations.md "Asynchronous checkpoints"): a run that writes its checkpoints in the
// background leaves the same files, byte for byte, as one that waits for them (the manifests differ only in their
// creation time), logs each with the loop's blocking time, and a resume from them continues exactly; the writer's
// phases: the temp directory until finish(), a snapshot that later changes to the source do not reach, and a failed
// background write reported by finish() naming the file.
#include "train/async_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "support/run_files.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::testing::file_bytes;

namespace {

nlohmann::json manifest_without_time(const std::string& dir) {
    nlohmann::json m = nlohmann::json::parse(file_bytes(dir + "/manifest.json"));
    m.erase("created_unix");
    return m;
}

}  // namespace

TEST(AsyncCheckpoint, EqualsABlockingCheckpointByteForByte) {
    std::map<bool, std::string> dirs;
    for (const bool async : {true, false}) {
        dirs[async] = mt::testing::fresh_dir(async ? "async" : "blocking");
        mt::train::Trainer t(mt::testing::tiny_job(dirs[async],
                                                   {"train.steps=9",
                                                    "checkpoint.every_steps=3",
                                                    "checkpoint.keep_last=10",
                                                    std::string("checkpoint.async=") + (async ? "true" : "false")}),
                             false);
        t.run();
    }
    for (const char* step : {"step_00000003", "step_00000006", "step_00000009"}) {
        const std::string a = dirs[true] + "/run/checkpoints/" + step, b = dirs[false] + "/run/checkpoints/" + step;
        ASSERT_TRUE(std::filesystem::exists(a + "/DONE")) << a;
        EXPECT_TRUE(file_bytes(a + "/rank_00000.safetensors") == file_bytes(b + "/rank_00000.safetensors")) << step;
        // The config differs in checkpoint.async and the run directory; everything else is the same.
        nlohmann::json ma = manifest_without_time(a), mb = manifest_without_time(b);
        ma.erase("config_toml"), mb.erase("config_toml");
        EXPECT_EQ(ma, mb) << step;
    }
    // Each checkpoint is an event with the loop's blocking time; the ones before the last were written in the
    // background.
    std::ifstream in(dirs[true] + "/run/metrics.jsonl");
    int async_events = 0;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.at("kind") != "event" || j.at("event") != "checkpoint") continue;
        EXPECT_GE(j.at("blocking_seconds").get<double>(), 0.0);
        EXPECT_GT(j.at("write_seconds").get<double>(), 0.0);
        async_events += j.at("async").get<bool>() ? 1 : 0;
    }
    EXPECT_EQ(async_events, 2);
}

// A run's last checkpoint is dropped; the run resumes from the one before it, written in the background, and writes
// the same last checkpoint again.
TEST(AsyncCheckpoint, AResumeFromABackgroundCheckpointContinuesExactly) {
    const std::string dir = mt::testing::fresh_dir("x");
    const auto job = mt::testing::tiny_job(dir, {"train.steps=8", "checkpoint.every_steps=3"});
    const std::string last = dir + "/run/checkpoints/step_00000008";
    {
        mt::train::Trainer straight(job, false);
        straight.run();
    }
    const std::string want = file_bytes(last + "/rank_00000.safetensors");
    ASSERT_FALSE(want.empty());
    std::filesystem::remove_all(last);
    mt::train::Trainer resumed(job, false);
    ASSERT_TRUE(resumed.resume_latest());
    EXPECT_EQ(resumed.step(), 6);
    resumed.run();
    EXPECT_TRUE(file_bytes(last + "/rank_00000.safetensors") == want);
}

TEST(AsyncCheckpoint, WriterPhasesAndSnapshots) {
    const std::string root = mt::testing::fresh_dir("x") + "/checkpoints";
    mt::train::AsyncCheckpointWriter w;
    mt::core::Tensor src = mt::core::Tensor::zeros({4}, mt::core::DType::f32);
    src.data<float>()[0] = 1.5f;
    const mt::core::Tensor snap = w.snapshot(0, src);
    src.data<float>()[0] = 9.0f;  // the training thread goes on changing its tensors
    w.start(root, 5, {{"w", "param", snap}}, {{"note", "x"}}, {}, nullptr);
    EXPECT_TRUE(w.in_flight());
    EXPECT_FALSE(std::filesystem::exists(root + "/step_00000005"));  // not before finish()
    const std::string dir = w.finish();
    EXPECT_FALSE(w.in_flight());
    EXPECT_TRUE(std::filesystem::exists(dir + "/DONE"));
    EXPECT_FALSE(std::filesystem::exists(root + "/step_00000005.tmp"));
    EXPECT_EQ(mt::train::checkpoint_open(dir, true).read("param", "w").data<float>()[0], 1.5f);

    // A write that fails on the background thread (a kind the format refuses) is rethrown by finish(); one whose
    // directory vanished before the manifest fails there, naming it.
    w.start(root, 6, {{"w", "a/b", w.snapshot(0, src)}}, {}, {}, nullptr);
    try {
        w.finish();
        FAIL() << "finish() of a failed background write succeeded";
    } catch (const mt::core::Error& e) {
        EXPECT_NE(std::string(e.what()).find("a/b"), std::string::npos) << e.what();
    }
    w.start(root, 7, {{"w", "param", w.snapshot(0, src)}}, {}, {}, nullptr);
    while (!w.file_done()) std::this_thread::yield();
    std::filesystem::remove_all(root + "/step_00000007.tmp");
    try {
        w.finish();
        FAIL() << "finish() of a checkpoint whose directory vanished succeeded";
    } catch (const mt::core::Error& e) {
        EXPECT_NE(std::string(e.what()).find("step_00000007"), std::string::npos) << e.what();
    }
    EXPECT_EQ(mt::train::checkpoint_find_latest(root), root + "/step_00000005");
}

// The snapshot buffers reserved in the background (reserve_in_background): reused by the snapshots that match them;
// a reservation that fails (here an impossible size: the host's memory) is reported by reservation_failure, not
// thrown at the first checkpoint, and what was reserved before it is given back.
TEST(AsyncCheckpoint, BackgroundReservationIsReusedOrReportsItsFailure) {
    using mt::core::DType;
    using mt::core::Tensor;
    {
        mt::train::AsyncCheckpointWriter w;
        const Tensor a = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({2, 3}, DType::bf16);
        w.reserve_in_background({a, b});
        EXPECT_EQ(w.reservation_failure(), "");
        const void* reserved = w.snapshot(1, b).raw();
        EXPECT_EQ(w.snapshot(1, b).raw(), reserved);  // the same buffer, not a new one
        EXPECT_GE(w.reservation_seconds(), 0.0);
    }
    mt::train::AsyncCheckpointWriter w;
    float one = 0.0f;
    const Tensor small = Tensor::zeros({4}, DType::f32);
    const Tensor huge = Tensor::borrow(&one, {int64_t{1} << 60}, DType::f32);  // 4 EiB: never allocated
    w.reserve_in_background({small, huge});
    EXPECT_NE(w.reservation_failure().find("out of host memory"), std::string::npos) << w.reservation_failure();
    const Tensor snap = w.snapshot(0, small);  // allocated on demand now
    EXPECT_EQ(snap.shape(), small.shape());
}
