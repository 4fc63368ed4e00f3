// Tensor parallelism (with and without sequence parallelism) end to end under mpirun: every layout the world allows
// (tp = n, and tp = 2 x dp = 2 on four ranks) trains the tiny dense model, the same with Block AttnRes, sliding-window
// layers with global tokens and sink logits, and every recompute policy, and the loss curve, the gradient norm and
// the final parameters equal the one-process run with the same global batch (relative difference below 1e-5 in
// f32). The vocabulary (61) is padded to a multiple of tp.
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/mpi/layout_match.h"
#include "parallel/mpi/mpi_job.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

using mt::train::Trainer;
using namespace mt::parallel;
using mt::testing::data_dir;
using mt::testing::shared_dir;

namespace {

using mt::testing::expect_layout_matches;
using mt::testing::Layout;
using mt::testing::layout_name;

std::vector<Layout> layouts(int n) {
    std::vector<Layout> out = {{.tp = n, .sp = true}, {.tp = n, .sp = false}};
    if (n == 4) out.push_back({.tp = 2, .dp = 2});
    return out;
}

// tiny_job's model with as many key/value heads as query heads, so that tp = 4 divides both.
std::vector<std::string> dense() {
    return {"model.n_kv_heads=4"};
}

}  // namespace

TEST(TrainerTp, DenseMatchesOneProcessForEveryLayout) {
    const int n = dist_world().size();
    std::vector<Layout> all = layouts(n);
    all.push_back({1, n, false});  // the control: data parallelism alone, the same float reordering of sums
    for (const Layout& l : all) expect_layout_matches(layout_name("dense", l), l, dense(), 20);
}

// Tied embeddings (one vocab-parallel tensor for the lookup and the head), sliding-window layers with global tokens
// (a replicated parameter whose gradient each rank holds a part of) and sink logits (split by head), Block AttnRes
// (its mixes on each rank's rows under sequence parallelism), grouped-query heads (2 kv heads on tp = 2).
TEST(TrainerTp, WindowAttnResTiedMatchOneProcess) {
    const int n = dist_world().size();
    std::vector<std::string> model = {"model.tie_embeddings=true",
                                      "attn.window=6",
                                      "attn.window_layers=[2]",
                                      "attn.global_tokens=2",
                                      "attn.sink_logit=true",
                                      "attnres.mode=\"block\""};
    if (n == 4) model.push_back("model.n_kv_heads=4");
    for (const Layout& l : layouts(n)) expect_layout_matches(layout_name("mixed", l), l, model, 10);
}

// The KDA/attention hybrid (layer 0 KDA, layer 1 attention): KDA split by heads, its low-rank gate projections and
// output norm whole on every rank (their gradients summed over tp), with document masking (state resets at EOT).
TEST(TrainerTp, HybridKdaMatchesOneProcess) {
    const int n = dist_world().size();
    for (const Layout& l : layouts(n)) {
        std::vector<std::string> model = dense();
        model.insert(model.end(), {"model.layer_pattern=\"KA\"", "data.document_mask=true", "data.eot_token=0"});
        expect_layout_matches(layout_name("hybrid", l), l, model, 10);
    }
}

// MoE under tp (layer 0 dense, layer 1 MoE: 8 experts, top 2, one shared expert, QB every 3 steps): the routed
// experts spread over tp x ep (each tp rank routes its own rows, with or without sequence parallelism), the shared
// experts split over tp like the MLP, the router's gradient a part per rank; the routing counts and the QB biases
// equal one process's.
TEST(TrainerTp, MoeMatchesOneProcess) {
    const int n = dist_world().size();
    std::vector<Layout> all = layouts(n);
    if (n == 4) all.push_back({2, 1, true, 2});  // tp = 2 x ep = 2
    const std::vector<std::string> model = {"model.n_kv_heads=4",
                                            "moe.enabled=true",
                                            "moe.first_k_dense=1",
                                            "moe.num_experts=8",
                                            "moe.top_k=2",
                                            "moe.expert_ffn_dim=16",
                                            "moe.quantile.update_interval=3"};
    for (const Layout& l : all) expect_layout_matches(layout_name("moe", l), l, model, 10);
}

TEST(TrainerTp, EveryRecomputePolicyMatchesOneProcess) {
    const int n = dist_world().size();
    const Layout l{n, 1, true};
    for (const std::vector<std::string>& policy : std::vector<std::vector<std::string>>{
             {"recompute.policy=\"full\""},
             {"recompute.policy=\"selective\"", "recompute.modules=[\"norm\", \"attn_core\", \"mlp_act\"]"}}) {
        std::vector<std::string> model = dense();
        model.insert(model.end(), policy.begin(), policy.end());
        expect_layout_matches(layout_name(policy.size() == 1 ? "full" : "selective", l), l, model, 6);
    }
}

// Resharding (parallel.md §7): a checkpoint written under tensor parallelism (tp = n, dense and MoE; on four ranks
// also tp = 2 x dp = 2, whose ZeRO-1 slices of row-parallel weights are saved as boxes) resumes under one process and
// under pure data parallelism, and a one-process checkpoint resumes under tp = n: the next steps equal the
// uninterrupted run. The last tp = 2 x dp = 2 case has configs/tiny.toml's tied byte vocabulary (257, padded to 258)
// and width (128): the ZeRO-1 ranges of its embedding's shards start and end inside rows, so one rank writes up to
// three boxes of the same tensor into its file (their keys "kind/name", "kind/name#1", ...).
TEST(TrainerTp, CheckpointsResumeUnderAnotherLayout) {
    const int n = dist_world().size(), rank = dist_world().rank();
    const int64_t ga = 4;  // every layout's share of the global batch is whole
    struct Save {
        Layout l;
        bool moe = false;
        std::vector<std::string> model = {};
    };
    std::vector<Save> saves = {{{n, 1, true}, false}, {{n, 1, true}, true}};
    if (n == 4) {
        saves.push_back({{2, 2, true}, false});
        saves.push_back(
            {{2, 2, true}, false, {"model.vocab_size=257", "model.tie_embeddings=true", "model.d_model=128"}});
    }
    auto self = comm_make_self();
    for (const auto& [l, moe, model] : saves) {
        const char* prefix = moe ? "ckpt_moe" : model.empty() ? "ckpt" : "ckpt_v257";
        const std::string dir = shared_dir(layout_name(prefix, l)), data = data_dir();
        auto job = [&](const std::string& run, int64_t accum, std::vector<std::string> extra) {
            std::vector<std::string> o = dense();
            o.insert(o.end(), model.begin(), model.end());
            // MoE: the experts spread over the tp ranks (boxes of the expert stacks), the QB state in the manifest.
            if (moe)
                o.insert(o.end(),
                         {"moe.enabled=true",
                          "moe.first_k_dense=1",
                          "moe.num_experts=8",
                          "moe.top_k=2",
                          "moe.expert_ffn_dim=16"});
            o.insert(o.end(), {"train.steps=8", "train.grad_accum=" + std::to_string(accum)});
            o.insert(o.end(), extra.begin(), extra.end());
            return mt::testing::mpi_job(data, run, o);
        };
        const std::vector<std::string> tp_keys = {"parallel.tp=" + std::to_string(l.tp),
                                                  "parallel.dp=" + std::to_string(l.dp)};
        std::vector<double> losses;
        {
            Trainer t(job(dir + "/tp", ga, tp_keys), false);
            for (int step = 1; step <= 8; ++step) {
                losses.push_back(t.train_step().loss);
                if (step == 4) t.save_checkpoint();
            }
        }
        const std::string ckpt = dir + "/tp/checkpoints/step_00000004";
        // Every rank resumes the whole model as one process (its own run directory).
        Trainer one(job(fmt::format("{}/one_r{}", dir, rank), ga * l.dp, {"parallel.dp=1"}), false, self.get());
        one.load_checkpoint(ckpt);
        ASSERT_EQ(one.step(), 4);
        // And all ranks together as pure data parallelism (dp = n).
        Trainer dp(job(dir + "/dp", ga * l.dp / n, {"parallel.dp=" + std::to_string(n)}), false);
        dp.load_checkpoint(ckpt);
        for (int step = 5; step <= 8; ++step) {
            const double expected = losses[static_cast<size_t>(step - 1)];
            const double a = one.train_step().loss, b = dp.train_step().loss;
            EXPECT_LT(std::abs(a - expected) / expected, 1e-5) << layout_name("one", l) << " step " << step;
            EXPECT_LT(std::abs(b - expected) / expected, 1e-5) << layout_name("dp", l) << " step " << step;
        }
    }
    // One process's checkpoint, resumed under tp = n.
    const std::string dir = shared_dir("ckpt_from_one"), data = data_dir();
    std::vector<std::string> base = dense();
    base.insert(base.end(), {"train.steps=8"});
    std::vector<std::string> one_keys = base, tp_keys = base;
    one_keys.insert(one_keys.end(), {"train.grad_accum=" + std::to_string(ga), "parallel.dp=1"});
    tp_keys.insert(tp_keys.end(),
                   {"train.grad_accum=" + std::to_string(ga), "parallel.tp=" + std::to_string(n), "parallel.dp=1"});
    std::vector<double> losses;
    {
        Trainer t(mt::testing::mpi_job(data, fmt::format("{}/one_r{}", dir, rank), one_keys), false, self.get());
        for (int step = 1; step <= 8; ++step) {
            losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    Trainer tp(mt::testing::mpi_job(data, dir + "/tp", tp_keys), false);
    tp.load_checkpoint(fmt::format("{}/one_r{}/checkpoints/step_00000004", dir, rank));
    for (int step = 5; step <= 8; ++step) {
        const double b = tp.train_step().loss, expected = losses[static_cast<size_t>(step - 1)];
        EXPECT_LT(std::abs(b - expected) / expected, 1e-5) << "one -> tp step " << step;
    }
}

// Fewer key/value heads than tp ranks (vLLM's rule): each kv head is replicated on tp / n_kv_heads ranks, whose
// gradients are summed; one kv head over tp = n, and on four ranks 2 kv heads over tp = 4 and one over tp = 2 x dp = 2
// (ZeRO-1). A checkpoint saved under tp = n resumes under one process.
TEST(TrainerTp, ReplicatedKvHeadsMatchOneProcess) {
    const int n = dist_world().size(), rank = dist_world().rank();
    std::vector<std::pair<Layout, int>> cases = {{{.tp = n}, 1}, {{.tp = n, .sp = false}, 1}};  // (layout, kv heads)
    if (n == 4) cases.insert(cases.end(), {{{.tp = 4}, 2}, {{.tp = 2, .dp = 2}, 1}});
    for (const auto& [l, kv] : cases)
        expect_layout_matches(
            layout_name(kv == 1 ? "kv1" : "kv2", l), l, {"model.n_kv_heads=" + std::to_string(kv)}, 10);
    const std::string dir = mt::testing::shared_dir("kv_ckpt"), data = mt::testing::data_dir();
    auto job = [&](const std::string& run, std::vector<std::string> extra) {
        std::vector<std::string> o = {"model.n_kv_heads=1", "train.steps=8"};
        o.insert(o.end(), extra.begin(), extra.end());
        return mt::testing::mpi_job(data, run, o);
    };
    std::vector<double> losses;
    {
        Trainer t(job(dir + "/tp", {"parallel.tp=" + std::to_string(n)}), false);
        for (int step = 1; step <= 8; ++step) {
            losses.push_back(t.train_step().loss);
            if (step == 4) t.save_checkpoint();
        }
    }
    auto self = mt::parallel::comm_make_self();
    Trainer one(job(fmt::format("{}/one_r{}", dir, rank), {"parallel.dp=1"}), false, self.get());
    one.load_checkpoint(dir + "/tp/checkpoints/step_00000004");
    for (int step = 5; step <= 8; ++step) {
        const double expected = losses[static_cast<size_t>(step - 1)], a = one.train_step().loss;
        EXPECT_LT(std::abs(a - expected) / expected, 1e-5) << "replicated kv heads -> one process, step " << step;
    }
}
