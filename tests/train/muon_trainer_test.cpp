// optim.name = "muon" in the trainer (muon.md §2, §5 and §9 tests 3, 7 and 9): the parameter routing of the tiny and
// the hybrid MoE models, training that learns and differs from AdamW, a bitwise resume with the momentum in the
// checkpoint, bitwise determinism, Muon's gradients left unclipped by the global norm, and the layouts it refuses
// (exit 2).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;
using mt::testing::tiny_job;

// muon.md §2 written as a rule over the names: AdamW for the embedding, the LM head, norm gains, conv filters, KDA's
// A_log and dt_bias, global memory tokens, sink logits and Block AttnRes' queries and gains; Muon for every other
// weight, which must be a matrix or a stack of expert matrices.
bool expect_adamw(const std::string& name) {
    for (const char* part :
         {"embed.", "lm_head.", "norm", "conv1d", "A_log", "dt_bias", "global_tokens", ".sink", "attnres"})
        if (name.find(part) != std::string::npos) return true;
    return false;
}

void expect_routing(const JobConfig& cfg, int64_t want_muon_min) {
    Trainer trainer(cfg, false);
    const nn::ParamTable& table = trainer.model().params();
    int64_t muon = 0;
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        const bool is_muon = spec.group == nn::OptimGroup::muon;
        EXPECT_EQ(is_muon, !expect_adamw(spec.name)) << spec.name;
        if (is_muon) {
            EXPECT_TRUE(spec.shape.size() == 2 ||
                        (spec.shape.size() == 3 && spec.name.find(".experts.") != std::string::npos))
                << spec.name;
            ++muon;
        }
    }
    EXPECT_GE(muon, want_muon_min);
}

TEST(MuonRouting, EveryParameterLandsInItsGroup) {
    const std::string dir = fresh_dir("routing");
    expect_routing(tiny_job(dir, {"optim.name=\"muon\""}), 2 * 7);  // q, k, v, o, gate, up, down per layer
    // The hybrid MoE with Block AttnRes, window layers with global tokens and the sink: every kind of parameter.
    expect_routing(tiny_job(dir,
                            mt::testing::tiny_moe_overrides({"optim.name=\"muon\"",
                                                             "model.n_layers=4",
                                                             "model.layer_pattern=\"KA\"",
                                                             "attnres.mode=\"block\"",
                                                             "attnres.block_size=2",
                                                             "attn.sink_logit=true",
                                                             "attn.window=8",
                                                             "attn.window_layers=[4]",
                                                             "attn.global_tokens=2",
                                                             "moe.num_shared_experts=1"})),
                   20);
}

std::vector<double> losses(const JobConfig& cfg, int64_t steps) {
    Trainer trainer(cfg, false);
    std::vector<double> out;
    for (int64_t s = 0; s < steps; ++s) out.push_back(trainer.train_step().loss);
    return out;
}

// Muon learns the pattern data (as AdamW does at the same learning rate) and takes another path than AdamW.
TEST(MuonTrainer, LearnsAndDiffersFromAdamW) {
    const std::string dir = fresh_dir("learns");
    const std::vector<std::string> keys = {"train.steps=30", "train.lr=1e-2"};
    auto with = [&](const std::string& name) {
        std::vector<std::string> k = keys;
        k.push_back("optim.name=\"" + name + "\"");
        k.push_back("run.dir=\"" + dir + "/" + name + "\"");
        return tiny_job(dir, k);
    };
    const std::vector<double> muon = losses(with("muon"), 30), adamw = losses(with("adamw"), 30);
    EXPECT_LT(muon.back(), 0.7 * muon.front());
    EXPECT_NE(muon[3], adamw[3]);
    std::printf("loss after 30 steps: muon %.4f, adamw %.4f (from %.4f)\n", muon.back(), adamw.back(), muon.front());
}

// Bitwise determinism and an exact resume: the momentum is in the checkpoint (muon.momentum), so 3 steps, a
// checkpoint and 3 more equal 6 straight; a run that dropped the momentum at the checkpoint would differ.
TEST(MuonTrainer, ResumeIsBitIdenticalAndRunsAreDeterministic) {
    const std::string dir = fresh_dir("resume");
    auto job = [&](const std::string& run) {
        return tiny_job(dir,
                        {"optim.name=\"muon\"", "model.layer_pattern=\"KA\"", "run.dir=\"" + dir + "/" + run + "\""});
    };
    const std::vector<double> straight = losses(job("straight"), 6);
    EXPECT_EQ(losses(job("again"), 6), straight);
    std::vector<double> resumed;
    {
        Trainer trainer(job("split"), false);
        for (int s = 0; s < 3; ++s) resumed.push_back(trainer.train_step().loss);
        trainer.save_checkpoint();
        trainer.train_step();
    }
    {
        Trainer trainer(job("split"), false);
        ASSERT_TRUE(trainer.resume_latest());
        while (trainer.step() < 6) resumed.push_back(trainer.train_step().loss);
    }
    EXPECT_EQ(resumed, straight);
}

// muon.md §5: the global-norm clip scales the AdamW group only. A clip of 1e-3 (far below the gradient norm) leaves
// the step of every Muon matrix bitwise the same as no clip at all: its gradients reach Newton-Schulz unscaled.
TEST(MuonTrainer, GlobalNormClipLeavesTheMuonGroupAlone) {
    const std::string dir = fresh_dir("clip");
    auto muon_params_after = [&](const std::string& clip) {
        Trainer trainer(tiny_job(dir, {"optim.name=\"muon\"", "train.grad_clip=" + clip}), false);
        const StepResult r = trainer.train_step();
        EXPECT_GT(r.grad_norm, 1e-2);  // so that 1e-3 clips
        std::vector<core::Tensor> out;
        const nn::ParamTable& table = trainer.model().params();
        for (int i = 0; i < table.size(); ++i)
            if (table.spec(i).group == nn::OptimGroup::muon) out.push_back(table.master(i).clone());
        return out;
    };
    const auto loose = muon_params_after("0"), tight = muon_params_after("1e-3");
    ASSERT_EQ(loose.size(), tight.size());
    ASSERT_FALSE(loose.empty());
    for (size_t k = 0; k < loose.size(); ++k)
        for (int64_t i = 0; i < loose[k].numel(); ++i)
            ASSERT_EQ(core::tensor_get_flat(loose[k], i), core::tensor_get_flat(tight[k], i)) << "matrix " << k;
}

TEST(MuonTrainer, RefusesWhatIsNotBuiltYet) {
    const std::string dir = fresh_dir("refuse");
    try {
        tiny_job(dir, {"optim.name=\"muon\"", "parallel.tp=2"});
        ADD_FAILURE() << "expected exit 2 for tp = 2";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("optim.name = \"muon\" with parallel.tp = 2"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace mt::train
