// Optimizer offload and bf16 optimizer state in the trainer: the same loss curve as on-device AdamW (bit for bit on
// the CPU, whose arithmetic is the same kernel's; within 1e-5 relative on the GPU), exact resume with either on,
// and the configurations that are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace {

using mt::testing::fresh_dir;
using mt::testing::tiny_job;
using mt::train::Trainer;

std::vector<double> losses(const std::string& dir, std::vector<std::string> overrides, int steps) {
    overrides.push_back("train.steps=" + std::to_string(steps));
    Trainer trainer(tiny_job(dir, overrides), false);
    std::vector<double> out;
    for (int s = 0; s < steps; ++s) out.push_back(trainer.train_step().loss);
    return out;
}

const std::vector<std::string> kMoe = {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"};

TEST(TrainerOffload, SameLossesAsOnDeviceBitForBit) {
    for (const auto& model : {std::vector<std::string>{}, kMoe}) {
        const std::string dir = fresh_dir("offload");
        const std::vector<double> device = losses(dir, model, 20);
        std::vector<std::string> off = model;
        off.push_back("optim.offload=\"cpu\"");
        EXPECT_EQ(losses(dir, off, 20), device);
    }
}

// Straight 8 steps vs 4, checkpoint, resume, 4 more: the same losses, with offload, bf16 moments, and both.
TEST(TrainerOffload, ExactResume) {
    for (const auto& extra :
         std::vector<std::vector<std::string>>{{"optim.offload=\"cpu\""},
                                               {"optim.state_dtype=\"bf16\""},
                                               {"optim.offload=\"cpu\"", "optim.state_dtype=\"bf16\""}}) {
        const std::string dir = fresh_dir("resume");
        auto job = [&](const std::string& run) {
            std::vector<std::string> o = extra;
            o.push_back("run.dir=\"" + dir + "/" + run + "\"");
            return tiny_job(dir, o);
        };
        std::vector<double> straight, resumed;
        {
            Trainer t(job("straight"), false);
            for (int s = 0; s < 8; ++s) straight.push_back(t.train_step().loss);
        }
        {
            Trainer t(job("split"), false);
            for (int s = 0; s < 4; ++s) resumed.push_back(t.train_step().loss);
            t.save_checkpoint();
            t.train_step();  // past the checkpoint: the resumed run must not see it
        }
        {
            Trainer t(job("split"), false);
            ASSERT_TRUE(t.resume_latest());
            while (t.step() < 8) resumed.push_back(t.train_step().loss);
        }
        EXPECT_EQ(resumed, straight) << extra.back();
    }
}

// bf16 moments train as well as f32 ones over 20 steps on the tiny model (within 2% of the loss).
TEST(TrainerOffload, Bf16StateLearnsLikeF32) {
    const std::string dir = fresh_dir("bf16");
    const std::vector<double> f32 = losses(dir, {}, 20);
    const std::vector<double> bf16 = losses(dir, {"optim.state_dtype=\"bf16\""}, 20);
    EXPECT_NE(bf16, f32);
    EXPECT_LT(bf16.back(), bf16.front() - 0.5);
    EXPECT_NEAR(bf16.back(), f32.back(), 0.02 * f32.back());
}

TEST(TrainerOffload, StateBytesLeaveOutHostMemoryOnlyOnAGpu) {
    const std::string dir = fresh_dir("bytes");
    Trainer device(tiny_job(dir), false);
    Trainer off(tiny_job(dir, {"optim.offload=\"cpu\""}), false);
    // On the CPU the host is the device: the separate master arena is counted too.
    const int64_t master = static_cast<int64_t>(off.model().params().master_arena().nbytes());
    EXPECT_EQ(off.state_bytes(), device.state_bytes() + master);
    EXPECT_TRUE(off.model().params().precision().has_master_copy());
}

TEST(GpuTrainerOffload, SameLossesAsOnDeviceWithin1e5) {
    if (!mt::core::backend_available(mt::core::Device::cuda)) GTEST_SKIP() << "no CUDA device";
    const std::string dir = fresh_dir("gpu");
    const std::vector<std::string> gpu = {"run.device=\"cuda\"", "run.precision=\"f32\""};
    const std::vector<double> device = losses(dir, gpu, 20);
    std::vector<std::string> off = gpu;
    off.push_back("optim.offload=\"cpu\"");
    const std::vector<double> host = losses(dir, off, 20);
    ASSERT_EQ(host.size(), device.size());
    for (size_t i = 0; i < host.size(); ++i) EXPECT_NEAR(host[i], device[i], 1e-5 * std::fabs(device[i])) << i;
    Trainer t(tiny_job(dir, off), false);
    t.train_step();
    // On the GPU the master weights and moments are host memory: only the bf16 weights and f32 gradients count.
    const auto& table = t.model().params();
    EXPECT_EQ(t.state_bytes(), static_cast<int64_t>(table.param_arena().nbytes() + table.grad_arena().nbytes()));
}

}  // namespace
