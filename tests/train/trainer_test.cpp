// Trainer: learning, exact resume (bit-identical losses), checkpoints that do not fit, bad token data, threads,
// train.cuda_graphs without a GPU.
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "support/gpu_compare.h"
#include "support/tiny_job.h"
#include "train/checkpoint_io.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::testing::fresh_dir;
using mt::testing::moe_biases;
using mt::testing::tiny_job;
using mt::train::Trainer;

TEST(Trainer, LossGoesDown) {
    const std::string dir = fresh_dir("learn");
    Trainer trainer(tiny_job(dir, {"train.steps=40", "train.schedule=\"constant\""}), false);
    const double first = trainer.train_step().loss;
    double last = first;
    while (trainer.step() < 40) last = trainer.train_step().loss;
    EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
    EXPECT_LT(trainer.evaluate(), first - 1.0);
}

namespace {

// Straight 2n steps vs n steps, checkpoint, a step past it (discarded), resume, n more steps: equal losses (and
// equal MoE balancer biases at the end).
void check_exact_resume(const std::string& dir, const std::vector<std::string>& extra) {
    const int64_t n = 4;
    auto job = [&](const std::string& run) {
        std::vector<std::string> overrides = extra;
        overrides.push_back("run.dir=\"" + dir + "/" + run + "\"");
        return tiny_job(dir, overrides);
    };
    std::vector<double> straight;
    std::vector<float> straight_bias;
    {
        Trainer trainer(job("straight"), false);
        for (int64_t s = 0; s < 2 * n; ++s) straight.push_back(trainer.train_step().loss);
        straight_bias = moe_biases(trainer);
    }
    std::vector<double> resumed;
    {
        Trainer trainer(job("split"), false);
        for (int64_t s = 0; s < n; ++s) resumed.push_back(trainer.train_step().loss);
        trainer.save_checkpoint();
        // Keep going past the checkpoint: the resumed run must not see this.
        trainer.train_step();
    }
    {
        Trainer trainer(job("split"), false);
        ASSERT_TRUE(trainer.resume_latest());
        EXPECT_EQ(trainer.step(), n);
        while (trainer.step() < 2 * n) resumed.push_back(trainer.train_step().loss);
        EXPECT_EQ(moe_biases(trainer), straight_bias);
    }
    ASSERT_EQ(straight.size(), resumed.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

}  // namespace

TEST(Trainer, ExactResumeIsBitIdentical) {
    check_exact_resume(fresh_dir("resume"), {});
}

// A hybrid model (a KDA layer, then NoPE attention) resumes exactly too, and learns.
TEST(Trainer, HybridExactResumeIsBitIdentical) {
    check_exact_resume(fresh_dir("resume"), {"model.layer_pattern=\"KA\""});
}

// MoE layers (layer 0 dense, layer 1 MoE): Quantile Balancing with an update interval of 3, so the checkpoint at
// step 4 is mid-interval (accumulated histogram, counters and bounds must come back), and the sign-bias rule.
const std::vector<std::string> kMoe = {"moe.enabled=true",
                                       "moe.num_experts=6",
                                       "moe.top_k=2",
                                       "moe.expert_ffn_dim=16",
                                       "moe.quantile.update_interval=3",
                                       "moe.quantile.ema=0.5"};

TEST(Trainer, MoeExactResumeIsBitIdentical) {
    check_exact_resume(fresh_dir("resume"), kMoe);
    std::vector<std::string> sign = kMoe;
    sign.push_back("moe.balance=\"sign_bias\"");
    check_exact_resume(fresh_dir("resume_sign"), sign);
}

TEST(Trainer, MoeLossGoesDownAndBiasMoves) {
    const std::string dir = fresh_dir("learn");
    std::vector<std::string> overrides = kMoe;
    overrides.insert(overrides.end(), {"train.steps=40", "train.schedule=\"constant\""});
    Trainer trainer(tiny_job(dir, overrides), false);
    const double first = trainer.train_step().loss;
    double last = first;
    mt::train::StepResult r;
    while (trainer.step() < 40) last = (r = trainer.train_step()).loss;
    EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
    ASSERT_EQ(r.moe.size(), 1u);
    EXPECT_EQ(r.moe[0].first, 1);
    EXPECT_GT(r.moe[0].second.bias_range, 0.0);
    EXPECT_EQ(r.moe[0].second.tokens, 2 * 4 * 16);  // both micro-batches of the step
}

TEST(Trainer, HybridLossGoesDown) {
    const std::string dir = fresh_dir("learn");
    Trainer trainer(tiny_job(dir, {"train.steps=40", "train.schedule=\"constant\"", "model.layer_pattern=\"KA\""}),
                    false);
    EXPECT_GE(trainer.model().params().find("layers.0.kda.A_log"), 0);
    const double first = trainer.train_step().loss;
    double last = first;
    while (trainer.step() < 40) last = trainer.train_step().loss;
    EXPECT_LT(last, first - 1.0) << "first " << first << " last " << last;
}

TEST(Trainer, CheckpointThatDoesNotFitNamesTheTensor) {
    const std::string dir = fresh_dir("fit");
    {
        Trainer trainer(tiny_job(dir), false);
        trainer.train_step();
        trainer.save_checkpoint();
    }
    Trainer wider(tiny_job(dir, {"model.d_ff=96"}), false);
    try {
        wider.resume_latest();
        FAIL() << "expected a checkpoint error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::checkpoint);
        EXPECT_NE(std::string(e.what()).find("layers.0.mlp.w_down.weight"), std::string::npos) << e.what();
    }
}

TEST(Trainer, TokenIdsAtOrAboveVocabAreDataErrors) {
    const std::string dir = fresh_dir("vocab");
    auto cfg = tiny_job(dir);
    std::vector<int32_t> tokens(1000, 5);
    tokens[500] = 61;  // == vocab_size
    mt::data::llmc_write_shard(dir + "/bad.bin", tokens, 100);
    cfg.data.paths = {dir + "/bad.bin"};
    cfg.train.batch_size = 64;  // 64 windows of 16 cover every token
    try {
        Trainer trainer(cfg, false);
        trainer.train_step();
        FAIL() << "expected a data error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::data);
        EXPECT_NE(std::string(e.what()).find("bad.bin"), std::string::npos) << e.what();
    }
}

// train.cuda_graphs where there are none (a CPU run): the steps run as before, and one line says why.
TEST(Trainer, CudaGraphsWithoutAGpuRunTheStepsAsBeforeAndSayWhy) {
    const std::string dir = fresh_dir("graphs_cpu");
    std::vector<double> plain, asked;
    {
        Trainer t(tiny_job(dir, {"run.dir=\"" + dir + "/plain\""}), false);
        while (t.step() < 3) plain.push_back(t.train_step().loss);
    }
    ::testing::internal::CaptureStdout();
    {
        Trainer t(tiny_job(dir, {"run.dir=\"" + dir + "/asked\"", "train.cuda_graphs=true"}), true);
        while (t.step() < 3) asked.push_back(t.train_step().loss);
        EXPECT_EQ(t.model().graph_captures(), 0);
        EXPECT_EQ(t.model().graph_replays(), 0);
    }
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(out.find("train.cuda_graphs: the training steps run without CUDA graphs here: the device has no CUDA "
                       "graphs"),
              std::string::npos)
        << out;
    EXPECT_EQ(plain, asked);
}

TEST(Trainer, ZeroThreadsShareTheCoresAmongTheRanksOfAMachine) {
    // run.threads = 0 is the cores this process may use, and for ranks that a launcher started together on one
    // machine without pinning them, cores / local ranks (at least 1), so they do not each take every core.
    const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"};
    std::vector<std::pair<std::string, std::string>> saved;
    for (const char* v : vars)
        if (const char* value = std::getenv(v)) saved.emplace_back(v, value);
    for (const char* v : vars) ::unsetenv(v);
    const int procs = omp_get_num_procs(), before = omp_get_max_threads();
    const bool pinned = procs != static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    auto shared = [&](int ranks) { return pinned ? procs : std::max(1, procs / ranks); };
    EXPECT_EQ(mt::train::trainer_set_threads(3), 3);
    EXPECT_EQ(mt::train::trainer_set_threads(0), procs);
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    EXPECT_EQ(mt::train::trainer_set_threads(0), shared(2));
    EXPECT_EQ(mt::train::trainer_set_threads(5), 5) << "an explicit count is kept";
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "100000", 1);
    EXPECT_EQ(mt::train::trainer_set_threads(0), shared(100000));
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    EXPECT_EQ(mt::train::trainer_set_threads(0), shared(2));
    ::unsetenv("LOCAL_WORLD_SIZE");
    for (const auto& [v, value] : saved) ::setenv(v.c_str(), value.c_str(), 1);
    omp_set_num_threads(before);
}
