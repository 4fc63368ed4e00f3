// Context parallelism end to end under mpirun (long_context.md §7, docs/distributed.md "Context parallelism"): every
// layout the world allows (cp = n; on four ranks also cp = 2 x dp = 2 and cp = 2 x ep = 2) trains side by side with
// one process running the same global batch, and the loss curve, the gradient norm, the MoE routing counts and the
// final parameters agree within 1e-5 (relative, f32): the attention model with RoPE under both cp.attn modes, the
// KDA/attention hybrid with document masking under both cp.kda modes, and the hybrid with MoE and Block AttnRes. A
// checkpoint written under cp resumes under one process and one written by one process resumes under cp.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/context_parallel.h"
#include "parallel/mpi/layout_match.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;

namespace {

using mt::testing::expect_layout_matches;
using mt::testing::Layout;
using mt::testing::layout_name;

std::vector<Layout> layouts(int n, bool moe = false) {
    std::vector<Layout> out = {{.cp = n}};
    if (n == 4)
        out.insert(out.end(),
                   {{.dp = 2, .cp = 2}, {.tp = 2, .cp = 2}, {.tp = 2, .sp = false, .cp = 2}, {.pp = 2, .cp = 2}});
    if (n == 4 && moe) out.push_back({.ep = 2, .cp = 2});
    return out;
}

// tiny_job's model at the shortest length the largest cp group cuts (2 x 4 x 64 tokens on four ranks; the eight-
// and sixteen-rank combinations run cp = 2).
std::vector<std::string> model(std::vector<std::string> extra = {}) {
    const int64_t seq = cp_granularity(dist_world().size() > 4 ? 2 : dist_world().size());
    std::vector<std::string> o = {
        "train.seq_len=" + std::to_string(seq), "model.max_seq_len=" + std::to_string(seq), "train.eval_batches=2"};
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
}

std::vector<std::string> hybrid(const char* kda_mode) {
    return model({"model.layer_pattern=\"KA\"",
                  "data.document_mask=true",
                  "data.eot_token=0",
                  "kda.chunk_size=32",
                  std::string("cp.kda=\"") + kda_mode + "\""});
}

std::vector<std::string> moe_keys() {
    return {"moe.enabled=true",
            "moe.first_k_dense=1",
            "moe.num_experts=8",
            "moe.top_k=2",
            "moe.expert_ffn_dim=16",
            "moe.quantile.update_interval=3"};
}

}  // namespace

// lr 2e-3 (as the pipeline tests): at tiny_job's 1e-2 Adam grows the ring's summation-order differences (its merges
// add each query's keys in another order than one pass) to 8.9e-6 of the gradient norm under cp = 2 x dp = 2 within
// 8 steps, too near the bar to tell a fault from them.
TEST(TrainerCp, AttentionMatchesOneProcessUnderBothModes) {
    for (const char* mode : {"allgather", "ring"})
        for (const Layout& l : layouts(dist_world().size()))
            expect_layout_matches(
                layout_name(mode, l),
                l,
                model({"model.attn_pos=\"rope\"", std::string("cp.attn=\"") + mode + "\"", "train.lr=2e-3"}),
                8);
}

TEST(TrainerCp, HybridKdaMatchesOneProcessUnderBothModes) {
    for (const char* mode : {"affine", "relay"})
        for (const Layout& l : layouts(dist_world().size()))
            expect_layout_matches(layout_name(mode, l), l, hybrid(mode), 8);
}

// The tiny hybrid MoE AttnRes model: 8 experts (top 2) in layer 1 with QB every 3 steps, Block AttnRes, document
// masking; on four ranks also with the experts over ep = 2 beside cp = 2. lr 2e-3 (as the pipeline tests): at
// tiny_job's 1e-2, under cp = 2 x dp = 2 one token's top-2 choice flips at step 2 (a near tie of two experts' scores
// that the summation-order differences of step 1 decide: loads 905 / 1378 against 904 / 1379), Adam and QB (which
// counts the flipped tokens) grow the difference, and the curve leaves 1e-5 at step 5 (the routing of step 1 and the
// losses up to step 4 agree).
TEST(TrainerCp, HybridMoeAttnResMatchesOneProcess) {
    std::vector<std::string> keys = hybrid("affine");
    for (const std::string& k : moe_keys()) keys.push_back(k);
    keys.insert(keys.end(), {"attnres.mode=\"block\"", "train.lr=2e-3"});
    for (const Layout& l : layouts(dist_world().size(), true)) expect_layout_matches(layout_name("moe", l), l, keys, 8);
}

// Context parallelism with sequence segments and recompute (long_context.md §4 with §7): rows of two cp granules run
// as two segments of one granule each (`long.segment_tokens`), every segment zigzagged alone; the hybrid with
// document masking and selective recompute of KDA and attention under both cp.kda modes, on four ranks also with
// dp = 2 and with pp = 2 (the stages pass each segment's cp rows), equals one process over 6 steps.
TEST(TrainerCp, SegmentsAndRecomputeMatchOneProcess) {
    const int64_t granule = cp_granularity(dist_world().size() > 4 ? 2 : dist_world().size());
    std::vector<Layout> with_segments = {{.cp = dist_world().size()}};
    if (dist_world().size() == 4) with_segments.insert(with_segments.end(), {{.dp = 2, .cp = 2}, {.pp = 2, .cp = 2}});
    for (const char* mode : {"affine", "relay"}) {
        std::vector<std::string> keys = hybrid(mode);
        keys.insert(keys.end(),
                    {"train.seq_len=" + std::to_string(2 * granule),
                     "model.max_seq_len=" + std::to_string(2 * granule),
                     "long.segment_tokens=" + std::to_string(granule),
                     "recompute.policy=\"selective\"",
                     "recompute.modules=[\"kda\", \"attn_core\"]"});
        for (const Layout& l : with_segments) expect_layout_matches(layout_name(mode, l) + "_segments", l, keys, 6);
    }
}

// The combinations of the five-dimensional mesh on eight ranks (tests/CMakeLists.txt runs this case alone at
// np 8): cp = 2 with tp = 2 and dp = 2 (the hybrid: KDA and attention split by heads, sequence parallel), with
// ep = 2 and pp = 2 (the hybrid MoE AttnRes model: the experts over ep, the stages passing their cp rows) and with
// pp = 2 and dp = 2; each equals one process over 8 steps.
TEST(TrainerCp, EightRankCombinations) {
    if (dist_world().size() != 8) GTEST_SKIP() << "cp = 2 with two other dimensions of 2 needs eight ranks";
    std::vector<std::string> moe = hybrid("affine");
    for (const std::string& k : moe_keys()) moe.push_back(k);
    moe.insert(moe.end(), {"attnres.mode=\"block\"", "train.lr=2e-3"});
    expect_layout_matches("cp2_tp2_dp2", {.tp = 2, .dp = 2, .cp = 2}, hybrid("affine"), 8);
    expect_layout_matches("cp2_ep2_pp2", {.ep = 2, .pp = 2, .cp = 2}, moe, 8);
    expect_layout_matches("cp2_pp2_dp2", {.dp = 2, .pp = 2, .cp = 2}, hybrid("relay"), 8);
}

// All five dimensions but dp on sixteen ranks (its own CTest entry mpi.np16, label mpi16, which CI runs): tp = 2 x
// cp = 2 x ep = 2 x pp = 2 on the hybrid MoE model; the loss curve over 10 steps equals one process.
TEST(TrainerCp, SixteenRankMesh) {
    if (dist_world().size() != 16) GTEST_SKIP() << "tp = 2 x cp = 2 x ep = 2 x pp = 2 needs sixteen ranks";
    std::vector<std::string> keys = hybrid("affine");
    for (const std::string& k : moe_keys()) keys.push_back(k);
    keys.push_back("train.lr=2e-3");
    expect_layout_matches("tp2_cp2_ep2_pp2", {.tp = 2, .ep = 2, .pp = 2, .cp = 2}, keys, 10);
}

// Resharding: cp holds no shard of any parameter (every cp rank has the whole model, the first writes it), so a
// checkpoint written under cp = n resumes as one process, and one process's resumes under cp = n: the next steps
// equal the uninterrupted run's.
TEST(TrainerCp, CheckpointsResumeAcrossCpLayouts) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const std::string dir = mt::testing::shared_dir("cp_ckpt"), data = mt::testing::data_dir();
    auto job = [&](const std::string& run, std::vector<std::string> extra) {
        std::vector<std::string> o = hybrid("affine");
        o.insert(o.end(), {"train.steps=8", "train.grad_accum=2"});
        o.insert(o.end(), extra.begin(), extra.end());
        return mt::testing::mpi_job(data, run, o);
    };
    auto self = comm_make_self();
    std::vector<double> cp_losses, one_losses;
    {
        Trainer t(job(dir + "/cp", {"parallel.cp=" + std::to_string(n)}), false);
        for (int step = 1; step <= 8; ++step) {
            cp_losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    {
        Trainer t(job(fmt::format("{}/one_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
        for (int step = 1; step <= 8; ++step) {
            one_losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    Trainer one(job(fmt::format("{}/resume_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
    one.load_checkpoint(dir + "/cp/checkpoints/step_00000004");
    Trainer cp(job(dir + "/resume_cp", {"parallel.cp=" + std::to_string(n)}), false);
    cp.load_checkpoint(fmt::format("{}/one_r{}/checkpoints/step_00000004", dir, rank));
    for (int step = 5; step <= 8; ++step) {
        const double a = one.train_step().loss, b = cp.train_step().loss;
        const double expect_a = cp_losses[static_cast<size_t>(step - 1)];
        const double expect_b = one_losses[static_cast<size_t>(step - 1)];
        EXPECT_LT(std::abs(a - expect_a) / expect_a, 1e-5) << "cp -> one process, step " << step;
        EXPECT_LT(std::abs(b - expect_b) / expect_b, 1e-5) << "one process -> cp, step " << step;
    }
}
