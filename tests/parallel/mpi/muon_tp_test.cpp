// optim.name = "muon" under tensor parallelism (muon.md §3 "TP-sharded matrices", §9 test 4 with tp): each tp rank
// forms the direction of its slice of a split matrix, the slices are gathered whole, every tp rank runs the same
// Newton-Schulz and applies its own slice; the matrices tp does not split are stepped whole on every tp rank. The
// losses, gradient norms and parameters after 10 steps equal one process's (parameters rho <= 1e-6): tp = n with and
// without sequence parallelism (whole-matrix ownership, the default, and replicated Muon), the key/value heads
// replicated over the tp ranks (tiny's 2 kv heads on tp = 4), MoE, and on four ranks tp = 2 x dp = 2. QK-clip under
// tp (a tau below every logit: each tp rank scales its heads' rows, with the group maximum over the replicas of a kv
// head) and muon.per_head match too. The momentum is saved per tp shard and one process resumes from it.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/mpi/layout_match.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using namespace mt::testing;

namespace {

std::vector<std::string> muon_tp_keys(int zero_stage, bool kv4 = true) {
    std::vector<std::string> keys = {
        "optim.name=\"muon\"", "parallel.zero_stage=" + std::to_string(zero_stage), "train.lr=5e-3"};
    if (kv4) keys.push_back("model.n_kv_heads=4");  // tp = 4 divides the key/value heads
    return keys;
}

}  // namespace

TEST(TrainerMuonTp, TensorParallelEqualsOneProcess) {
    const int n = dist_world().size();
    if (n > 4) GTEST_SKIP() << "tiny's 4 query heads split over at most 4 tp ranks";
    std::vector<Layout> layouts = {{.tp = n, .sp = true}, {.tp = n, .sp = false}};
    if (n == 4) layouts.push_back({.tp = 2, .dp = 2});
    for (const Layout& l : layouts) {
        expect_layout_matches(layout_name("muon_tp_owned", l), l, muon_tp_keys(1), 10, 1e-6);
        expect_layout_matches(layout_name("muon_tp_replicated", l), l, muon_tp_keys(0), 10, 1e-6);
    }
    std::vector<std::string> moe = muon_tp_keys(1);
    moe.insert(moe.end(), {"moe.enabled=true", "moe.num_experts=4", "moe.top_k=2", "moe.expert_ffn_dim=16"});
    expect_layout_matches(layout_name("muon_tp_moe", {.tp = n}), {.tp = n}, moe, 10, 1e-6);
}

TEST(TrainerMuonTp, ReplicatedKvHeadsAndQkClipEqualOneProcess) {
    const int n = dist_world().size();
    if (n > 4) GTEST_SKIP() << "tiny's 4 query heads split over at most 4 tp ranks";
    // tiny's 2 kv heads: on four ranks each is replicated on two (the W_k slices gathered from the first replica).
    expect_layout_matches(layout_name("muon_tp_kv2", {.tp = n}), {.tp = n}, muon_tp_keys(1, false), 10, 1e-6);
    std::vector<std::string> clipped = muon_tp_keys(1, false);
    clipped.push_back("optim.qk_clip_tau=0.01");
    expect_layout_matches(layout_name("muon_tp_qk_clip", {.tp = n}), {.tp = n}, clipped, 10, 1e-6);
    // muon.per_head: the q, k, v heads lie whole on their tp rank (no gather), the replicated kv heads on each replica.
    std::vector<std::string> per_head = muon_tp_keys(1, false);
    per_head.push_back("muon.per_head=true");
    expect_layout_matches(layout_name("muon_tp_per_head", {.tp = n}), {.tp = n}, per_head, 10, 1e-6);
}

TEST(TrainerMuonTp, MomentumOfTpShardsResumesOnOneProcess) {
    const int n = dist_world().size();
    if (n > 4) GTEST_SKIP() << "tiny's 4 query heads split over at most 4 tp ranks";
    const std::string dir = shared_dir("muon_tp_resume");
    std::vector<std::string> keys = muon_tp_keys(1);
    keys.insert(keys.end(), {"parallel.tp=" + std::to_string(n), "train.grad_accum=2", "train.steps=8"});
    ResumeRun run;
    ASSERT_NO_FATAL_FAILURE(expect_exact_resume(mpi_job(data_dir(), dir, keys), &run));
    auto self = mt::parallel::comm_make_self();
    std::vector<std::string> one = muon_tp_keys(1);
    one.insert(one.end(), {"train.grad_accum=2", "train.steps=8", "parallel.tp=1"});
    mt::train::Trainer single(mpi_job(data_dir(), dir + "/one", one), false, self.get());
    single.load_checkpoint(run.checkpoint);
    for (int step = 5; step <= 8; ++step) {
        const double loss = single.train_step().loss, want = run.losses[size_t(step - 1)];
        EXPECT_LT(std::abs(loss - want) / want, 1e-5) << "step " << step << ": " << loss << " vs " << want;
    }
}
