// Data parallelism end to end under mpirun: the loss curve of dp = world equals the one-process run with the same
// global batch (relative difference below 1e-5 in f32), the replicas' weights stay identical, and a checkpoint
// written under dp resumes exactly; the loss is normalised by the global batch's supervised tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "nn/model.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;
using mt::testing::data_dir;
using mt::testing::shared_dir;

namespace {

mt::train::JobConfig job(const std::string& data, const std::string& run_dir, std::vector<std::string> overrides) {
    return mt::testing::mpi_job(data, run_dir, std::move(overrides));
}

double master_sum(Trainer& t) {
    const auto m = t.model().params().master_arena();
    double s = 0.0;
    for (int64_t i = 0; i < m.numel(); ++i) s += m.data<float>()[i] * static_cast<double>((i % 7) + 1);
    return s;
}

}  // namespace

TEST(TrainerDp, LossCurveMatchesOneProcessWithTheSameGlobalBatch) {
    const int n = dist_world().size();
    const int64_t ga = 2;  // per rank; the one-process run takes n times as many micro-batches
    const std::string dir = shared_dir("run"), data = data_dir();
    auto self = comm_make_self();
    Trainer single(
        job(data, dir + "/single", {"train.grad_accum=" + std::to_string(ga * n), "parallel.dp=1"}), false, self.get());
    Trainer dp(job(data, dir + "/dp", {"train.grad_accum=" + std::to_string(ga)}), false);
    ASSERT_EQ(dp.dp_size(), n);
    ASSERT_EQ(dp.tokens_per_step(), single.tokens_per_step());
    double worst_loss = 0.0, worst_norm = 0.0;
    for (int step = 1; step <= 20; ++step) {
        const auto a = single.train_step();
        const auto b = dp.train_step();
        const double rel_loss = std::abs(a.loss - b.loss) / std::abs(a.loss);
        const double rel_norm = std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm);
        worst_loss = std::max(worst_loss, rel_loss);
        worst_norm = std::max(worst_norm, rel_norm);
        EXPECT_LT(rel_loss, 1e-5) << "step " << step << ": one process " << a.loss << ", dp=" << n << " " << b.loss;
        EXPECT_LT(rel_norm, 1e-5) << "step " << step << " grad norm: " << a.grad_norm << " vs " << b.grad_norm;
    }
    const double va = single.evaluate(), vb = dp.evaluate();
    EXPECT_LT(std::abs(va - vb) / va, 1e-5) << "val loss " << va << " vs " << vb;
    // The replicas stepped with the same reduced gradients, so their weights are bitwise equal.
    const double mine = master_sum(dp);
    double lo = mine, hi = mine;
    dist_world().all_reduce(&lo, 1, CommType::f64, ReduceOp::min).wait();
    dist_world().all_reduce(&hi, 1, CommType::f64, ReduceOp::max).wait();
    EXPECT_EQ(lo, hi) << "data-parallel replicas diverged";
    if (dist_world().rank() == 0)
        fmt::print(
            "dp={} vs one process, 20 steps: max relative difference loss {:.2e}, grad norm {:.2e}, val {:.2e}\n",
            n,
            worst_loss,
            worst_norm,
            std::abs(va - vb) / va);
}

// The context-length curriculum under data parallelism: the stage schedule counts the global batch and each rank reads
// its share of the stage's samples, so dp = world follows the one-process loss curve through the stage switch (two
// stages of 16 and 32 tokens, a quarter and a half of the rows long).
TEST(TrainerDp, CurriculumMatchesOneProcessThroughTheStageSwitch) {
    const int n = dist_world().size();
    const int64_t ga = 2;
    const std::string dir = shared_dir("run"), data = data_dir();
    const std::string docs = mt::testing::write_document_shard(data);
    const std::vector<std::string> curriculum = {
        "data.paths=[\"" + docs + "\"]",
        "data.eot_token=60",
        "model.max_seq_len=32",
        "train.steps=8",
        "long.passkey_eval=false",
        "long.stages=[{seq_len=16, tokens=" + std::to_string(4 * 2 * ga * n * 16) +
            ", long_fraction=0.25}, {seq_len=32, tokens=100000, long_fraction=0.5}]"};
    auto with = [&](std::vector<std::string> o) {
        o.insert(o.end(), curriculum.begin(), curriculum.end());
        return o;
    };
    auto self = comm_make_self();
    Trainer single(job(data, dir + "/single", with({"train.grad_accum=" + std::to_string(ga * n), "parallel.dp=1"})),
                   false,
                   self.get());
    Trainer dp(job(data, dir + "/dp", with({"train.grad_accum=" + std::to_string(ga)})), false);
    for (int step = 1; step <= 8; ++step) {
        const auto a = single.train_step();
        const auto b = dp.train_step();
        EXPECT_EQ(dp.seq_len(), step <= 4 ? 16 : 32) << "step " << step;
        EXPECT_EQ(dp.stage(), single.stage());
        EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-5)
            << "step " << step << ": one process " << a.loss << ", dp=" << n << " " << b.loss;
        EXPECT_LT(std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm), 1e-5) << "step " << step;
    }
}

TEST(TrainerDp, CheckpointResumesExactlyAndRecordsTheMesh) {
    const int n = dist_world().size();
    const std::string dir = shared_dir("run"), data = data_dir();
    mt::testing::ResumeRun run;
    ASSERT_NO_FATAL_FAILURE(mt::testing::expect_exact_resume(job(data, dir, {"checkpoint.keep_last=5"}), &run));
    EXPECT_EQ(run.manifest.at("mesh").at("dp"), n);
    EXPECT_EQ(run.manifest.at("mesh").at("world"), n);
    EXPECT_EQ(run.manifest.at("data").at("ranks").size(), static_cast<size_t>(n));
}

// The loss is normalised by the supervised tokens of the global batch (long_context.md §5): rank 0's sequence
// supervises 2 of its 16 targets and every other rank's all 16. dp = world with one sequence per rank gives the loss
// and the gradients of one process taking the same sequences as micro-batches; a mean of per-rank means would weigh
// rank 0's two tokens eight times more.
TEST(TrainerDp, LossIsNormalisedByTheSupervisedTokensOfTheGlobalBatch) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const int64_t t = 16;
    const std::string dir = shared_dir("run"), data = data_dir();
    auto rows = [&](int first, int count) {
        mt::core::Tensor inputs = mt::core::Tensor::zeros({count, 1, t}, mt::core::DType::i32),
                         targets = inputs.clone();
        for (int r = 0; r < count; ++r)
            for (int64_t i = 0; i < t; ++i) {
                const uint64_t at = static_cast<uint64_t>((first + r) * t + i);
                mt::core::tensor_set_flat(inputs, r * t + i, static_cast<double>(mt::core::rng_u64(3, 0, at) % 61));
                const bool supervised = first + r > 0 || i < 2;
                mt::core::tensor_set_flat(
                    targets,
                    r * t + i,
                    supervised ? static_cast<double>(mt::core::rng_u64(3, 1, at) % 61) : mt::nn::kIgnoreIndex);
            }
        return std::pair{inputs, targets};
    };
    auto self = comm_make_self();
    const std::vector<std::string> one_sequence = {"train.batch_size=1", "train.seq_len=16"};
    auto single_cfg = one_sequence, dp_cfg = one_sequence;
    single_cfg.insert(single_cfg.end(), {"train.grad_accum=" + std::to_string(n), "parallel.dp=1"});
    dp_cfg.push_back("train.grad_accum=1");
    Trainer single(job(data, dir + "/single", single_cfg), false, self.get());
    Trainer dp(job(data, dir + "/dp", dp_cfg), false);
    ASSERT_EQ(dp.dp_size(), n);
    const auto [all_inputs, all_targets] = rows(0, n);
    const auto [my_inputs, my_targets] = rows(rank, 1);
    const auto a = single.train_step(all_inputs, all_targets);
    const auto b = dp.train_step(my_inputs, my_targets);
    ASSERT_GT(a.loss, 0.0);
    EXPECT_LT(std::abs(a.loss - b.loss) / a.loss, 1e-6) << "one process " << a.loss << ", dp=" << n << " " << b.loss;
    EXPECT_LT(std::abs(a.grad_norm - b.grad_norm) / a.grad_norm, 1e-5)
        << "grad norm: one process " << a.grad_norm << ", dp=" << n << " " << b.grad_norm;
}
