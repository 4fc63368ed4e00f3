// Exact resume on the GPU: steps 1..N straight equal steps 1..k, a checkpoint, a step past it (discarded), a resume
// and steps k+1..N, bit for bit: the losses, and the checkpoints both runs write at step N (master weights, both
// AdamW moments, the MoE balancers' state, the loss scaler and the data position). For bf16, fp16 with dynamic loss
// scaling (a scale that grows before the checkpoint, which falls mid-window, and after it), MoE with
// Quantile Balancing (the checkpoint mid-interval), the KDA hybrid and Block AttnRes. Checkpoints that cross devices
// are checked by what they load: the master weights and moments a CPU checkpoint loads into a GPU run (and the
// reverse) are the saved ones, bit for bit. Checkpoints written in the background (checkpoint.async: the snapshots
// copied on their own stream while the next steps run) equal blocking ones. Skipped without a GPU (label gpu).
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "support/gpu_compare.h"
#include "support/tiny_job.h"
#include "train/checkpoint_io.h"
#include "train/safetensors.h"

using mt::testing::fresh_dir;
using mt::testing::latest_checkpoint;
using mt::testing::tiny_job;
using mt::train::Trainer;
using GpuTraining = mt::testing::GpuTrainingTest;

namespace {

constexpr int64_t kSplit = 4, kSteps = 9;

// What the straight run did: skipped (fp16 overflow) steps, and the loss scale at the split and at the end.
struct StraightRun {
    int skipped = 0;
    double scale_at_split = 0, scale_at_end = 0;
};

// The straight and the split run of `extra` on the GPU, compared.
StraightRun check_gpu_exact_resume(const std::string& name, const std::vector<std::string>& extra) {
    const std::string dir = fresh_dir(name);
    auto job = [&](const std::string& run) {
        std::vector<std::string> o = {"run.device=\"cuda\"", "train.steps=" + std::to_string(kSteps)};
        o.insert(o.end(), extra.begin(), extra.end());
        o.push_back("run.dir=\"" + dir + "/" + run + "\"");
        return tiny_job(dir, o);
    };
    std::vector<double> straight, resumed;
    StraightRun run;
    {
        Trainer t(job("straight"), false);
        while (t.step() < kSteps) {
            const auto r = t.train_step();
            straight.push_back(r.loss);
            run.skipped += r.skipped ? 1 : 0;
            if (t.step() == kSplit) run.scale_at_split = t.loss_scale();
        }
        run.scale_at_end = t.loss_scale();
        t.save_checkpoint();
    }
    {
        Trainer t(job("split"), false);
        while (t.step() < kSplit) resumed.push_back(t.train_step().loss);
        t.save_checkpoint();
        t.train_step();  // past the checkpoint: the resumed run must not see this step
    }
    {
        Trainer t(job("split"), false);
        EXPECT_TRUE(t.resume_latest());
        EXPECT_EQ(t.step(), kSplit);
        EXPECT_EQ(t.loss_scale(), run.scale_at_split) << name;
        while (t.step() < kSteps) resumed.push_back(t.train_step().loss);
        EXPECT_EQ(t.loss_scale(), run.scale_at_end) << name;
        t.save_checkpoint();
    }
    EXPECT_EQ(straight.size(), resumed.size());
    if (straight.size() != resumed.size()) return run;
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << name << ": step " << i + 1;
    const int n = mt::testing::expect_checkpoints_identical(
        latest_checkpoint(dir + "/straight"), latest_checkpoint(dir + "/split"), name);
    std::printf("%s: %zu losses and %d checkpoint tensors compared bit for bit after a resume at step %lld\n",
                name.c_str(),
                straight.size(),
                n,
                static_cast<long long>(kSplit));
    return run;
}

const std::vector<std::string> kMoe = {"moe.enabled=true",
                                       "moe.num_experts=8",
                                       "moe.top_k=2",
                                       "moe.expert_ffn_dim=32",
                                       "moe.balance=\"quantile\"",
                                       "moe.quantile.update_interval=3"};

}  // namespace

TEST_F(GpuTraining, ExactResumeIsBitIdentical) {
    check_gpu_exact_resume("bf16", {"run.precision=\"bf16\""});
    // fp16 with a dynamic scale that grows every 3 clean steps from 256: it grows before the checkpoint at step 4,
    // which falls mid-window (the clean-step counter must come back), and twice after it. A start that overflowed
    // instead would skip every step of so short a run, leaving weights and moments untouched: the premise below.
    const StraightRun fp16 = check_gpu_exact_resume(
        "fp16", {"run.precision=\"fp16\"", "train.loss_scale_init=256", "train.loss_scale_window=3"});
    EXPECT_EQ(fp16.skipped, 0) << "fp16: steps skipped, so weights and moments did not move";
    EXPECT_GT(fp16.scale_at_split, 256.0) << "fp16: the scale did not grow before the checkpoint";
    EXPECT_GT(fp16.scale_at_end, fp16.scale_at_split) << "fp16: the scale did not grow after the checkpoint";
    std::printf("fp16: loss scale 256 -> %g at step %lld -> %g at step %lld, %d steps skipped\n",
                fp16.scale_at_split,
                static_cast<long long>(kSplit),
                fp16.scale_at_end,
                static_cast<long long>(kSteps),
                fp16.skipped);
    std::vector<std::string> moe = kMoe;
    moe.push_back("run.precision=\"bf16\"");
    check_gpu_exact_resume("moe_qb", moe);
    check_gpu_exact_resume("hybrid", {"model.layer_pattern=\"KA\"", "run.precision=\"bf16\""});
    check_gpu_exact_resume("attnres", {"attnres.mode=\"block\"", "attnres.block_size=3", "run.precision=\"bf16\""});
}

namespace {

// A checkpoint written on `from` at step kSplit, loaded on `to`: what `to` saves at once (no step between) holds
// the same master weights, moments and balancer state, bit for bit.
void check_cross_device_load(const std::string& from, const std::string& to, const std::vector<std::string>& extra) {
    const std::string what = from + " -> " + to;
    const std::string dir = fresh_dir(from + "_to_" + to);
    auto job = [&](const std::string& device, const std::string& run) {
        std::vector<std::string> o = {"run.device=\"" + device + "\"", "run.dir=\"" + dir + "/" + run + "\""};
        o.insert(o.end(), extra.begin(), extra.end());
        return tiny_job(dir, o);
    };
    {
        Trainer t(job(from, "a"), false);
        while (t.step() < kSplit) t.train_step();
        t.save_checkpoint();
    }
    const std::string saved = latest_checkpoint(dir + "/a");
    Trainer t(job(to, "b"), false);
    t.load_checkpoint(saved);
    ASSERT_EQ(t.step(), kSplit);
    t.save_checkpoint();
    const int n = mt::testing::expect_checkpoints_identical(saved, latest_checkpoint(dir + "/b"), what);
    std::printf("%s: %d loaded tensors compared bit for bit\n", what.c_str(), n);
    // And it trains on from there.
    const double loss = t.train_step().loss;
    EXPECT_TRUE(std::isfinite(loss)) << what;
}

}  // namespace

TEST_F(GpuTraining, CrossDeviceLoadKeepsMastersAndMomentsBitForBit) {
    for (const auto& extra : {std::vector<std::string>{}, kMoe}) {
        check_cross_device_load("cuda", "cpu", extra);
        check_cross_device_load("cpu", "cuda", extra);
    }
}

// Asynchronous checkpoints on the GPU (docs/operations.md): the snapshots are copied on the copy lane while the next
// steps run, and the optimizer's update waits for them on the GPU. The checkpoints of steps 3 and 6 (background
// writes) and 9 (the run's last, blocking) equal a blocking run's bit for bit, MoE balancer state included.
TEST_F(GpuTraining, AsyncCheckpointsEqualBlockingOnes) {
    std::vector<std::string> extra = kMoe;
    extra.insert(extra.end(), {"run.precision=\"bf16\"", "train.steps=9", "checkpoint.every_steps=3"});
    const std::string dir = fresh_dir("async_gpu");
    auto run = [&](bool async) {
        std::vector<std::string> o = {"run.device=\"cuda\"",
                                      "checkpoint.keep_last=10",
                                      std::string("checkpoint.async=") + (async ? "true" : "false"),
                                      "run.dir=\"" + dir + (async ? "/async" : "/blocking") + "\""};
        o.insert(o.end(), extra.begin(), extra.end());
        Trainer t(tiny_job(dir, o), false);
        t.run();
    };
    run(true);
    run(false);
    int n = 0;
    for (const char* step : {"step_00000003", "step_00000006", "step_00000009"})
        n += mt::testing::expect_checkpoints_identical(
            dir + "/async/checkpoints/" + step, dir + "/blocking/checkpoints/" + step, step);
    EXPECT_GT(n, 0);
    std::printf("async vs blocking on the GPU: %d checkpoint tensors compared bit for bit\n", n);
}

// A NaN stored in a weight is refused on the GPU as on the CPU (tests/scripts/bad_input.sh), with the CRC check off:
// the finiteness check runs on the device (a sum of squares) and only then finds the element on the host. The
// message names the tensor, as the CPU's does.
TEST_F(GpuTraining, NonFiniteWeightInACheckpointIsRefused) {
    const std::string dir = fresh_dir("nan_gpu");
    auto job = [&] {
        return tiny_job(dir,
                        {"run.device=\"cuda\"",
                         "train.steps=4",
                         "checkpoint.verify_on_resume=false",
                         "run.dir=\"" + dir + "/run\""});
    };
    {
        Trainer t(job(), false);
        t.train_step();
        t.save_checkpoint();
    }
    const std::string file = latest_checkpoint(dir + "/run") + "/rank_00000.safetensors";
    const std::string key = "param/final_norm.weight";
    uint64_t at = 0;
    {
        const mt::train::SafetensorsFile st(file, mt::core::ExitCode::checkpoint);
        ASSERT_TRUE(st.has(key)) << file;
        ASSERT_EQ(st.info(key).dtype, mt::core::DType::f32);
        at = st.info(key).begin;
    }
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        uint64_t header = 0;
        f.read(reinterpret_cast<char*>(&header), 8);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        f.seekp(static_cast<std::streamoff>(8 + header + at + 3 * sizeof(float)));
        f.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
        ASSERT_TRUE(f.good()) << file;
    }
    Trainer t(job(), false);
    try {
        t.load_checkpoint(latest_checkpoint(dir + "/run"));
        ADD_FAILURE() << "a checkpoint with a NaN weight was loaded";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), mt::core::ExitCode::checkpoint);
        EXPECT_NE(std::string(e.what()).find("tensor final_norm.weight (param) holds a non-finite value (nan) at "
                                             "element 3"),
                  std::string::npos)
            << e.what();
    }
}
