// Image + text training on data read from disk (data.format = "webdataset" / "image_jsonl", docs/data.md
// "Image-text data"): shapes shards written by the `moetrain data --images` code train a tiny model whose loss falls,
// resume bit for bit (rows are functions of their index, whatever the loader thread did), evaluate on data.val_paths,
// and the config names what disk image data needs (the special ids after the tokenizer's vocabulary).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "data/image_text_write.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;

struct Shards {
    std::vector<std::string> train, val;
    std::string manifest;
};

Shards write_shards(const std::string& dir) {
    data::ShapesOptions shapes;
    shapes.stage = 1;
    data::ImageTextWriteOptions o;
    o.out_dir = dir + "/data";
    o.per_shard = 16;
    o.manifest = true;
    Shards s;
    const data::ImageTextWriteResult train = data::image_text_write_shapes(shapes, data::ShapesSplit::train, 32, o);
    s.train = train.shards;
    s.manifest = train.manifest;
    o.prefix = "val";
    o.manifest = false;
    s.val = data::image_text_write_shapes(shapes, data::ShapesSplit::val, 8, o).shards;
    return s;
}

std::string toml_list(const std::vector<std::string>& paths) {
    std::string out = "[";
    for (size_t i = 0; i < paths.size(); ++i) out += (i ? ", \"" : "\"") + paths[i] + "\"";
    return out + "]";
}

JobConfig disk_job(const std::string& dir, const Shards& shards, std::vector<std::string> overrides = {}) {
    std::vector<std::string> o = {"run.dir=\"" + dir + "\"",
                                  "run.device=\"cpu\"",
                                  "run.threads=2",
                                  "data.format=\"webdataset\"",
                                  "data.paths=" + toml_list(shards.train),
                                  "data.val_paths=" + toml_list(shards.val),
                                  "data.tokenizer=\"bytes\"",
                                  "data.eot_token=-1",
                                  "model.vocab_size=262",
                                  "vision.image_token=-1",
                                  "vision.min_pixels=3136",
                                  "vision.max_pixels=12544",
                                  "train.batch_size=2",
                                  "train.seq_len=96",
                                  "train.grad_accum=2",
                                  "train.eval_batches=2",
                                  "checkpoint.every_steps=0"};
    const std::vector<std::string> vision = mt::testing::tiny_vision_overrides();
    o.insert(o.end(), vision.begin(), vision.end());
    o.insert(o.end(), overrides.begin(), overrides.end());
    return config_load(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny.toml", o);
}

TEST(TrainerImagesDisk, WebDatasetTrainsResumesExactlyAndEvaluates) {
    const std::string dir = fresh_dir("wds");
    const Shards shards = write_shards(dir);
    EXPECT_EQ(disk_job(dir + "/x", shards).model.vision.image_token, 259);  // the bytes vocab 257 + 2
    std::vector<double> straight;
    {
        Trainer trainer(disk_job(dir + "/straight", shards), false);
        for (int s = 0; s < 6; ++s) straight.push_back(trainer.train_step().loss);
        const double val = trainer.evaluate();
        EXPECT_TRUE(std::isfinite(val));
        EXPECT_EQ(trainer.last_eval_bound(), 0.0);  // no image-blind bound for data from disk
    }
    EXPECT_LT(straight.back(), straight.front());
    std::vector<double> resumed;
    {
        Trainer trainer(disk_job(dir + "/split", shards), false);
        for (int s = 0; s < 3; ++s) resumed.push_back(trainer.train_step().loss);
        trainer.save_checkpoint();
    }
    {
        Trainer trainer(disk_job(dir + "/split", shards), false);
        ASSERT_TRUE(trainer.resume_latest());
        while (trainer.step() < 6) resumed.push_back(trainer.train_step().loss);
    }
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i + 1;
}

TEST(TrainerImagesDisk, JsonlManifestTrainsOnTheSameSamples) {
    const std::string dir = fresh_dir("jsonl");
    const Shards shards = write_shards(dir);
    Trainer tar(disk_job(dir + "/tar", shards), false);
    Trainer jsonl(
        disk_job(dir + "/jsonl",
                 shards,
                 {"data.format=\"image_jsonl\"", "data.paths=[\"" + shards.manifest + "\"]", "data.val_paths=[]"}),
        false);
    // The same samples in the same order: the same rows, so the same first losses.
    EXPECT_EQ(tar.train_step().loss, jsonl.train_step().loss);
    EXPECT_EQ(tar.train_step().loss, jsonl.train_step().loss);
}

TEST(TrainerImagesDisk, ConfigNamesWhatDiskImagesNeed) {
    const std::string dir = fresh_dir("refuse");
    const Shards shards = write_shards(dir);
    auto refused = [&](const std::vector<std::string>& o, const std::string& needle) {
        data::testing::expect_error([&] { disk_job(dir + "/r", shards, o); }, core::ExitCode::usage, {needle});
    };
    refused({"model.vocab_size=261"}, "need at least 262");
    refused({"vision.image_token=3"}, "<img_pad> is the tokenizer's vocab + 2 = 259");
    refused({"train.seq_len=20"}, "raise train.seq_len to at least 21");
    refused({"vision.max_pixels=4000"}, "max_pixels >= 2 x min_pixels");
    refused({"vision.layers=0"}, "needs a vision encoder");
    refused({"data.eot_token=1"}, "captions end with the tokenizer's EOT 256");
}

}  // namespace
}  // namespace mt::train
