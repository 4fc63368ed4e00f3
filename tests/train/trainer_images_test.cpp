// Image + text training in the trainer (data.format = "shapes", docs/multimodal.md): the shipped shapes_tiny config
// trains (the loss falls, the val loss is logged with its blind bound), resumes bit for bit from a checkpoint (the
// rows of generated samples are functions of their index), the ViT and projector get gradients every step, also with
// learned patch positions (vision.pos = "learned"), and the config refuses what image batches do not support (exit 2
// naming the key).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;

JobConfig shapes_job(const std::string& dir, std::vector<std::string> overrides = {}) {
    std::vector<std::string> o = {"run.dir=\"" + dir + "\"",
                                  "run.device=\"cpu\"",
                                  "run.threads=2",
                                  "train.batch_size=2",
                                  "train.seq_len=192",
                                  "train.grad_accum=2",
                                  "train.eval_batches=2",
                                  "checkpoint.every_steps=0"};
    const std::vector<std::string> vision = mt::testing::tiny_vision_overrides();
    o.insert(o.end(), vision.begin(), vision.end());
    o.insert(o.end(), overrides.begin(), overrides.end());
    return config_load(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny.toml", o);
}

// Six steps as three, a checkpoint, and three more in a fresh trainer that resumes it: the losses of steps 1..6.
std::vector<double> split_losses(const std::string& dir, const std::vector<std::string>& overrides) {
    std::vector<double> losses;
    {
        Trainer trainer(shapes_job(dir, overrides), false);
        for (int s = 0; s < 3; ++s) losses.push_back(trainer.train_step().loss);
        trainer.save_checkpoint();
    }
    Trainer trainer(shapes_job(dir, overrides), false);
    EXPECT_TRUE(trainer.resume_latest());
    while (trainer.step() < 6) losses.push_back(trainer.train_step().loss);
    return losses;
}

TEST(TrainerImages, ShapesTrainsResumesExactlyAndReportsTheBound) {
    const std::string dir = fresh_dir("shapes");
    std::vector<double> straight;
    {
        Trainer trainer(shapes_job(dir + "/straight"), false);
        for (int s = 0; s < 6; ++s) straight.push_back(trainer.train_step().loss);
        const double val = trainer.evaluate();
        EXPECT_TRUE(std::isfinite(val));
        // Stage 1: one object, color only: ln 8 nats per caption over its supervised tokens.
        EXPECT_GT(trainer.last_eval_bound(), 0.05);
        EXPECT_LT(trainer.last_eval_bound(), 0.5);
        // The vision tower learns: its parameters have gradients.
        nn::ParamTable& table = trainer.model().params();
        double vit = 0.0, proj = 0.0;
        for (int i = 0; i < table.size(); ++i) {
            const std::string& name = table.spec(i).name;
            const core::Tensor g = table.grad(i);
            double sq = 0.0;
            for (int64_t j = 0; j < g.numel(); ++j) sq += core::tensor_get_flat(g, j) * core::tensor_get_flat(g, j);
            if (name.starts_with("vision.")) vit += sq;
            if (name.starts_with("projector.")) proj += sq;
        }
        EXPECT_GT(vit, 0.0);
        EXPECT_GT(proj, 0.0);
    }
    EXPECT_LT(straight.back(), straight.front());
    const std::vector<double> resumed = split_losses(dir + "/split", {});
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i + 1;
}

// The shapes job with a 4 x 4 learned position table, resized up to the 8 .. 24 patch grids of the canvases: it trains,
// the table gets gradient, and resume is bit for bit (the table is checkpointed with its AdamW state).
TEST(TrainerImages, LearnedPositionsTrainAndResumeExactly) {
    const std::string dir = fresh_dir("shapes_learned");
    const std::vector<std::string> learned = {"vision.pos=\"learned\"", "vision.pos_grid=4"};
    std::vector<double> straight;
    {
        Trainer trainer(shapes_job(dir + "/straight", learned), false);
        for (int s = 0; s < 6; ++s) straight.push_back(trainer.train_step().loss);
        nn::ParamTable& table = trainer.model().params();
        const int i = table.find("vision.pos_embed.weight");
        ASSERT_GE(i, 0);
        EXPECT_EQ(table.spec(i).shape, (core::Shape{4, 4, 32}));
        double sq = 0.0;
        const core::Tensor g = table.grad(i);
        for (int64_t j = 0; j < g.numel(); ++j) sq += core::tensor_get_flat(g, j) * core::tensor_get_flat(g, j);
        EXPECT_GT(sq, 0.0);
    }
    EXPECT_LT(straight.back(), straight.front());
    const std::vector<double> resumed = split_losses(dir + "/split", learned);
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i + 1;
}

TEST(TrainerImages, ConfigRefusesWhatImageBatchesDoNotSupport) {
    const std::string dir = fresh_dir("refuse");
    auto refused = [&](const std::vector<std::string>& o, const std::string& key) {
        try {
            shapes_job(dir, o);
            ADD_FAILURE() << "accepted: " << key;
        } catch (const core::Error& e) {
            EXPECT_EQ(e.code(), core::ExitCode::usage) << e.what();
            EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        }
    };
    refused({"vision.layers=0"}, "vision.layers");
    refused({"vision.image_token=4"}, "vision.image_token");
    refused({"model.vocab_size=40"}, "model.vocab_size");
    refused({"parallel.tp=2"}, "parallel.tp");
    refused({"parallel.cp=2"}, "cp");
    refused({"vision.heads=3"}, "vision.heads");
    refused({"vision.pos=\"sincos\""}, "vision.pos");
    refused({"vision.pos=\"learned\"", "vision.pos_grid=0"}, "vision.pos_grid");
    refused({"data.eot_token=0"}, "data.eot_token");
    refused({"train.seq_len=24"}, "train.seq_len");  // a 112-pixel sample alone is 32
}

}  // namespace
}  // namespace mt::train
