// MoE models under data and expert parallelism, with the ZeRO-1 sharded optimizer, end to end under mpirun: for
// every layout the world allows (dp = n, ep = n, and ep = 2 x dp = 2 on four ranks) the loss curve equals the
// one-process run with the same global batch (relative difference below 1e-5 in f32), the balancer biases agree
// (histograms summed over the ranks), ZeRO-1 holds 1 / (ep dp) of the optimizer state per rank, and a checkpoint
// written by every rank resumes exactly. On n GPUs (skipped elsewhere): the same layouts over NCCL against one GPU
// (TrainerGpu, run by the CTest entries mpi_gpu.npN, labels gpu and mpi; tests/CMakeLists.txt names the suite).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/backend.h"
#include "core/cuda_probe.h"
#include "parallel/comm_nccl.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;
using mt::testing::data_dir;
using mt::testing::shared_dir;

namespace {

// A tiny MoE model (layer 0 dense, layer 1 MoE; 8 experts, top 2, one shared expert) with Quantile Balancing
// every 3 steps, so histograms accumulate across steps and a resume lands mid-interval.
mt::train::JobConfig moe_job(const std::string& data, const std::string& run_dir, std::vector<std::string> overrides) {
    overrides.insert(overrides.begin(),
                     {"moe.enabled=true",
                      "moe.first_k_dense=1",
                      "moe.num_experts=8",
                      "moe.top_k=2",
                      "moe.expert_ffn_dim=16",
                      "moe.quantile.update_interval=3"});
    return mt::testing::mpi_job(data, run_dir, overrides);
}

// The layouts of this world size: {ep, dp}.
std::vector<std::pair<int, int>> layouts(int n) {
    std::vector<std::pair<int, int>> out = {{1, n}, {n, 1}};
    if (n == 4) out.emplace_back(2, 2);
    return out;
}

std::vector<float> first_moe_bias(Trainer& t) {
    return t.model().moe_layers().at(0).second->balancer().bias();
}

}  // namespace

TEST(TrainerEp, MoeLossCurvesMatchOneProcessForEveryLayout) {
    const int n = dist_world().size();
    const int64_t ga = 2;
    for (const auto& [ep, dp] : layouts(n)) {
        const std::string dir = shared_dir(fmt::format("ep{}_dp{}", ep, dp)), data = data_dir();
        auto self = comm_make_self();
        Trainer single(moe_job(data, dir + "/single", {"train.grad_accum=" + std::to_string(ga * n), "parallel.dp=1"}),
                       false,
                       self.get());
        Trainer par(moe_job(data,
                            dir + "/par",
                            {"train.grad_accum=" + std::to_string(ga),
                             "parallel.ep=" + std::to_string(ep),
                             "parallel.dp=" + std::to_string(dp)}),
                    false);
        ASSERT_EQ(par.tokens_per_step(), single.tokens_per_step());
        ASSERT_EQ(par.data_size(), n);
        double worst_loss = 0.0, worst_norm = 0.0;
        for (int step = 1; step <= 20; ++step) {
            const auto a = single.train_step();
            const auto b = par.train_step();
            worst_loss = std::max(worst_loss, std::abs(a.loss - b.loss) / std::abs(a.loss));
            worst_norm = std::max(worst_norm, std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm));
            EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-5)
                << "ep=" << ep << " dp=" << dp << " step " << step << ": " << a.loss << " vs " << b.loss;
            EXPECT_LT(std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm), 1e-5)
                << "ep=" << ep << " dp=" << dp << " step " << step << " grad norm";
            ASSERT_EQ(a.moe.size(), b.moe.size());
            // Loads and token counts are summed over the ranks: the same integers as one process.
            EXPECT_EQ(a.moe.at(0).second.tokens, b.moe.at(0).second.tokens) << "step " << step;
        }
        const double va = single.evaluate(), vb = par.evaluate();
        EXPECT_LT(std::abs(va - vb) / va, 1e-5) << "ep=" << ep << " dp=" << dp << " val " << va << " vs " << vb;
        // The QB biases (updated from the summed histograms) agree with the one-process run's.
        const auto ba = first_moe_bias(single), bb = first_moe_bias(par);
        double worst_bias = 0.0;
        for (size_t j = 0; j < ba.size(); ++j) worst_bias = std::max(worst_bias, double(std::abs(ba[j] - bb[j])));
        EXPECT_LT(worst_bias, 1e-4) << "ep=" << ep << " dp=" << dp;
        if (dist_world().rank() == 0)
            fmt::print(
                "MoE ep={} dp={} vs one process, 20 steps: max relative difference loss {:.2e}, grad norm "
                "{:.2e}, val {:.2e}; max |bias difference| {:.2e}\n",
                ep,
                dp,
                worst_loss,
                worst_norm,
                std::abs(va - vb) / va,
                worst_bias);
    }
}

// Sequence segments under every layout (long_context.md §4): rows of 48 tokens in three segments of 16 on each rank
// train as one process running the same global batch in one pass. The gradient buckets are reduced once, after the
// last segment's backward, and ZeRO-1 waits for its gathers in the first segment's forward only.
TEST(TrainerEp, SegmentsUnderEveryLayoutMatchOneProcessInOnePass) {
    const int n = dist_world().size();
    const int64_t ga = 2;
    for (const auto& [ep, dp] : layouts(n)) {
        const std::string dir = shared_dir(fmt::format("seg_ep{}_dp{}", ep, dp)), data = data_dir();
        auto self = comm_make_self();
        const std::vector<std::string> rows = {"train.seq_len=48", "train.steps=6"};
        std::vector<std::string> one = rows, seg = rows;
        one.insert(one.end(), {"train.grad_accum=" + std::to_string(ga * n), "parallel.dp=1"});
        seg.insert(seg.end(),
                   {"train.grad_accum=" + std::to_string(ga),
                    "parallel.ep=" + std::to_string(ep),
                    "parallel.dp=" + std::to_string(dp),
                    "long.segment_tokens=16"});
        Trainer single(moe_job(data, dir + "/single", one), false, self.get());
        Trainer par(moe_job(data, dir + "/par", seg), false);
        for (int step = 1; step <= 6; ++step) {
            const auto a = single.train_step();
            const auto b = par.train_step();
            EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-5)
                << "ep=" << ep << " dp=" << dp << " step " << step << ": " << a.loss << " vs " << b.loss;
            EXPECT_LT(std::abs(a.grad_norm - b.grad_norm) / std::abs(a.grad_norm), 1e-5)
                << "ep=" << ep << " dp=" << dp << " step " << step << " grad norm";
            EXPECT_EQ(a.moe.at(0).second.tokens, b.moe.at(0).second.tokens) << "step " << step;
        }
        EXPECT_EQ(par.model().segment_bounds(), (std::vector<int64_t>{0, 16, 32, 48}));
    }
}

TEST(TrainerEp, ZeroOneShardsTheOptimizerState) {
    const int n = dist_world().size();
    for (const auto& [ep, dp] : layouts(n)) {
        for (int zero : {1, 0}) {
            Trainer t(moe_job(data_dir(),
                              shared_dir("zero"),
                              {"parallel.ep=" + std::to_string(ep),
                               "parallel.dp=" + std::to_string(dp),
                               "parallel.zero_stage=" + std::to_string(zero)}),
                      false);
            const int64_t total = t.optimizer_state_bytes_total(), mine = t.optimizer_state_bytes();
            int64_t sum = mine, most = mine;
            dist_world().all_reduce(&sum, 1, CommType::i64, ReduceOp::sum).wait();
            dist_world().all_reduce(&most, 1, CommType::i64, ReduceOp::max).wait();
            if (zero == 0) {
                // Replicated: every rank holds the moments of every parameter it has (its experts only under ep).
                if (ep == 1) {
                    EXPECT_EQ(mine, total);
                }
                EXPECT_GT(mine * n, total);
                continue;
            }
            // Sharded: every rank holds exactly 1 / n of the state (ep x dp = n ranks read different data).
            EXPECT_EQ(sum, total) << "ep=" << ep << " dp=" << dp;
            EXPECT_EQ(mine * n, total) << "ep=" << ep << " dp=" << dp << ": rank " << dist_world().rank();
            if (dist_world().rank() == 0)
                fmt::print(
                    "ZeRO-1 ep={} dp={}: optimizer state {} bytes for the model, {} on the largest rank "
                    "(total / {} = {})\n",
                    ep,
                    dp,
                    total,
                    most,
                    n,
                    total / n);
        }
    }
}

TEST(TrainerEp, CheckpointFromEveryRankResumesExactly) {
    const int n = dist_world().size();
    const int ep = 2, dp = n / 2;
    for (int zero : {1, 0}) {
        const std::string dir = shared_dir("run" + std::to_string(zero)), data = data_dir();
        const std::vector<std::string> layout = {"parallel.ep=" + std::to_string(ep),
                                                 "parallel.dp=" + std::to_string(dp),
                                                 "parallel.zero_stage=" + std::to_string(zero),
                                                 "checkpoint.keep_last=5"};
        SCOPED_TRACE("zero " + std::to_string(zero));
        mt::testing::ResumeRun run;
        ASSERT_NO_FATAL_FAILURE(mt::testing::expect_exact_resume(moe_job(data, dir, layout), &run));
        const std::vector<double>& straight = run.losses;
        const std::string& ckpt = run.checkpoint;
        EXPECT_EQ(run.manifest.at("mesh").at("ep"), ep);
        EXPECT_EQ(run.manifest.at("mesh").at("dp"), dp);
        EXPECT_EQ(run.manifest.at("files").size(), static_cast<size_t>(n)) << "every rank writes its shard";
        // The same checkpoint loads into another layout of the same world: dp = n without expert parallelism (each
        // rank reads its parts out of the global tensors that the ep x dp ranks wrote).
        {
            Trainer other(moe_job(data, dir + "_dp", {"parallel.ep=1", "parallel.dp=" + std::to_string(n)}), false);
            other.load_checkpoint(ckpt);
            const double a = other.train_step().loss;
            EXPECT_LT(std::abs(a - straight[4]) / straight[4], 1e-5) << "dp=" << n << " after the ep x dp checkpoint";
        }
        // And into one process (the global tensors are assembled from every rank's regions).
        if (zero == 1) {
            auto self = comm_make_self();
            Trainer one(moe_job(data, dir + "_one", {"train.grad_accum=" + std::to_string(2 * n), "parallel.dp=1"}),
                        false,
                        self.get());
            one.load_checkpoint(ckpt);
            const double a = one.train_step().loss;
            EXPECT_LT(std::abs(a - straight[4]) / straight[4], 1e-5) << "one process after the ep x dp checkpoint";
        }
    }
}

TEST(TrainerEp, SmallBucketsAreReducedDuringTheBackward) {
    // 4 KB buckets: the MoE model's arena becomes dozens of buckets, most of them complete (and issued) before
    // the backward reaches the embedding; the curve must not change.
    const int n = dist_world().size();
    const std::string dir = shared_dir("run"), data = data_dir();
    auto self = comm_make_self();
    Trainer single(moe_job(data, dir + "/single", {"train.grad_accum=" + std::to_string(2 * n), "parallel.dp=1"}),
                   false,
                   self.get());
    Trainer par(moe_job(data, dir + "/par", {"parallel.ep=2", "parallel.bucket_mb=0.004"}), false);
    for (int step = 1; step <= 5; ++step) {
        const auto a = single.train_step();
        const auto b = par.train_step();
        EXPECT_LT(std::abs(a.loss - b.loss) / std::abs(a.loss), 1e-5) << "step " << step;
        EXPECT_GT(par.gradient_buckets(), 10);
        EXPECT_GE(b.buckets_overlapped, par.gradient_buckets() / 2) << "step " << step;
        if (step == 5 && dist_world().rank() == 0)
            fmt::print(
                "{} gradient buckets, {} issued during the backward\n", par.gradient_buckets(), b.buckets_overlapped);
    }
}

// The MoE recompute modules under expert parallelism re-run the all-to-alls in the backward (moe_permute: the rows to
// the experts again; moe_experts: the expert outputs back to their sources): the same layout without recompute gives
// the same losses and gradient norms, bit for bit.
TEST(TrainerEp, MoeRecomputeModulesMatchNoneUnderExpertParallelism) {
    const std::string dir = shared_dir("run"), data = data_dir();
    Trainer none(moe_job(data, dir + "/none", {"parallel.ep=2"}), false);
    Trainer rec(moe_job(data,
                        dir + "/rec",
                        {"parallel.ep=2",
                         "recompute.policy=\"selective\"",
                         "recompute.modules=[\"moe_permute\", \"moe_experts\", \"moe_act\"]"}),
                false);
    for (int step = 1; step <= 4; ++step) {
        const auto a = none.train_step();
        const auto b = rec.train_step();
        EXPECT_EQ(a.loss, b.loss) << "step " << step;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    }
}

// Overlapped dispatch (moe.overlap_dispatch, the default): the shared expert's forward while the rows travel to
// the experts, the router's backward while the gradients travel back. The same ops on the same data as the blocking
// order: the losses, gradient norms and every master weight equal bit for bit, with and without the recompute of
// the permutation (whose rows go to the experts again in the backward).
TEST(TrainerEp, OverlappedDispatchEqualsBlockingBitForBit) {
    const int n = dist_world().size();
    const std::string dir = shared_dir("overlap"), data = data_dir();
    for (const bool recompute : {false, true}) {
        auto job = [&](const std::string& run, bool overlap) {
            std::vector<std::string> o = {"parallel.ep=" + std::to_string(n),
                                          std::string("moe.overlap_dispatch=") + (overlap ? "true" : "false")};
            if (recompute) o.insert(o.end(), {"recompute.policy=\"selective\"", "recompute.modules=[\"moe_permute\"]"});
            return moe_job(data, dir + "/" + run + (recompute ? "_rec" : ""), o);
        };
        Trainer blocking(job("blocking", false), false), overlapped(job("overlapped", true), false);
        for (int step = 1; step <= 4; ++step) {
            const auto a = blocking.train_step();
            const auto b = overlapped.train_step();
            EXPECT_EQ(a.loss, b.loss) << "step " << step << " recompute " << recompute;
            EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step << " recompute " << recompute;
        }
        const mt::nn::ParamTable& pa = blocking.model().params();
        const mt::nn::ParamTable& pb = overlapped.model().params();
        ASSERT_EQ(pa.size(), pb.size());
        int64_t compared = 0;
        for (int i = 0; i < pa.size(); ++i) {
            const mt::core::Tensor x = pa.master(i).clone(), y = pb.master(i).clone();
            ASSERT_EQ(x.nbytes(), y.nbytes()) << pa.spec(i).name;
            EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << pa.spec(i).name;
            compared += x.numel();
        }
        EXPECT_GT(compared, 0);
    }
}

TEST(TrainerGpu, DataAndExpertParallelOverNcclMatchOneGpu) {
    // One GPU per rank (NCCL for gradients and MoE rows, MPI for scalars) against one GPU with the same global
    // batch. f32 must agree as closely as on the CPU; bf16 within bf16 tolerance (rounding turns into different
    // routing near ties, so the curves drift like two seeds; the bars are the single-GPU curve tests').
    const int n = dist_world().size();
    const bool gpus = mt::core::backend_available(mt::core::Device::cuda) && mt::core::cuda_device_count() >= n;
    if (!gpus || !comm_nccl_compiled())
        GTEST_SKIP() << "needs " << n << " GPUs and the NCCL backend (" << mt::core::cuda_describe() << ")";
    for (const char* precision : {"f32", "bf16"}) {
        for (const auto& [ep, dp] : layouts(n)) {
            const std::string dir = shared_dir(fmt::format("gpu_{}_ep{}_dp{}", precision, ep, dp)), data = data_dir();
            const std::string prec = fmt::format("run.precision=\"{}\"", precision);
            const mt::train::JobConfig par_job = moe_job(data,
                                                         dir + "/par",
                                                         {"run.device=\"cuda\"",
                                                          prec,
                                                          "parallel.ep=" + std::to_string(ep),
                                                          "parallel.dp=" + std::to_string(dp)});
            // The parallel trainer first: its NCCL set-up makes this rank's GPU current for everything after.
            Trainer par(par_job, false);
            auto self = comm_make_self();
            Trainer single(
                moe_job(data,
                        dir + "/single",
                        {"run.device=\"cuda\"", prec, "train.grad_accum=" + std::to_string(2 * n), "parallel.dp=1"}),
                false,
                self.get());
            double worst = 0.0, last10 = 0.0;
            for (int step = 1; step <= 20; ++step) {
                const double a = single.train_step().loss, b = par.train_step().loss;
                const double rel = std::abs(a - b) / std::abs(a);
                worst = std::max(worst, rel);
                if (step > 10) last10 += rel / 10.0;
            }
            // A checkpoint of the parallel run resumes into a fresh parallel trainer with the same next step: under
            // ZeRO-1 with bf16 the master weights are sharded between checkpoints, so this fails unless the writer
            // gathers them first.
            par.save_checkpoint();
            Trainer resumed(par_job, false);
            resumed.load_checkpoint(dir + "/par/checkpoints/step_00000020");
            const double next = par.train_step().loss, again = resumed.train_step().loss;
            EXPECT_LT(std::abs(next - again) / std::abs(next), 1e-6)
                << precision << " ep=" << ep << " dp=" << dp << ": step 21 " << next << " vs resumed " << again;
            if (std::string(precision) == "f32") {
                EXPECT_LT(worst, 1e-4) << "f32 ep=" << ep << " dp=" << dp;
            } else {
                EXPECT_LT(worst, 0.15) << "bf16 ep=" << ep << " dp=" << dp;
                EXPECT_LT(last10, 0.02) << "bf16 ep=" << ep << " dp=" << dp;
            }
            if (dist_world().rank() == 0)
                fmt::print(
                    "GPU {} ep={} dp={} vs one GPU, 20 steps: worst relative loss difference {:.2e}, mean of "
                    "the last 10 {:.2e}; step 21 after resuming from step 20: {:.2e}\n",
                    precision,
                    ep,
                    dp,
                    worst,
                    last10,
                    std::abs(next - again) / std::abs(next));
        }
    }
}
