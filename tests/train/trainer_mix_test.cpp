// Mixed sources and loss weighting in the trainer (data.sources, loss.weighting; docs/multimodal.md "Mixed sources and
// loss weighting", multimodal.md §5, §8, §9 item 5): the mixture draws each source's share, each row's source is a
// function of its index (data-parallel ranks together read one process's rows), a single source with token_mean is
// the plain run bitwise, the row weights scale each row's loss and gradient, a text + shapes mixture trains and logs
// loss/<name> for both and resumes bit for bit under every weighting, and the config refuses bad sources (exit 2
// naming the field).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/llmc_shard.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;

// A token shard in the shapes vocabulary's words (ids 6..49: no specials, so no image slot), with EOS = 1 after every
// 20 tokens.
std::string write_shapes_text(const std::string& dir) {
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < 20000; ++i)
        tokens.push_back(i % 21 == 20 ? 1 : static_cast<int32_t>(6 + (i * 7 + i / 13) % 44));
    const std::string path = dir + "/words.bin";
    data::llmc_write_shard(path, tokens, 50);
    return path;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// configs/shapes_tiny.toml, smaller, over a text source (llmc, weight text_weight) and the shapes set (weight 1).
JobConfig mix_job(const std::string& dir,
                  const std::string& weighting,
                  std::vector<std::string> overrides = {},
                  double text_weight = 1.0) {
    std::filesystem::create_directories(dir);
    const std::string text = write_shapes_text(dir);
    const std::string toml = read_file(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny.toml") +
                             "\n[loss]\nweighting = \"" + weighting +
                             "\"\nuncertainty_lr = 0.05\ndwa_window = 1\ngradnorm_lr = 0.5\n"
                             "[[data.sources]]\nname = \"text\"\nformat = \"llmc\"\nweight = " +
                             std::to_string(text_weight) + "\npaths = [\"" + text +
                             "\"]\n"
                             "[[data.sources]]\nname = \"shapes\"\nformat = \"shapes\"\nshapes.stage = 1\n";
    std::vector<std::string> o = mt::testing::tiny_vision_overrides();
    for (const std::string& x : {"run.dir=\"" + dir + "/run\"",
                                 std::string("run.device=\"cpu\""),
                                 std::string("run.threads=2"),
                                 std::string("train.batch_size=2"),
                                 std::string("train.seq_len=192"),
                                 std::string("train.grad_accum=2"),
                                 std::string("train.eval_batches=1"),
                                 std::string("checkpoint.every_steps=0")})
        o.push_back(x);
    o.insert(o.end(), overrides.begin(), overrides.end());
    return config_parse(toml, dir + "/job.toml", o);
}

TEST(MixSources, DrawsTheWeightedShares) {
    std::vector<DataSource> sources(3);
    sources[0].weight = 1.0;
    sources[1].weight = 3.0;
    sources[2].weight = 0.5;
    const std::vector<double> cumulative = mix_cumulative(sources);
    EXPECT_EQ(cumulative.back(), 1.0);
    const int64_t n = 10000;
    std::vector<int64_t> counts(3, 0);
    for (int64_t g = 0; g < n; ++g) ++counts[static_cast<size_t>(mix_source_of_row(1234, g, cumulative))];
    for (size_t i = 0; i < 3; ++i) {
        const double p = sources[i].weight / 4.5, sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
        EXPECT_LT(std::abs(static_cast<double>(counts[i]) - static_cast<double>(n) * p), 3 * sigma)
            << "source " << i << ": " << counts[i] << " of " << n;
    }
    // Another seed draws other rows.
    int64_t same = 0;
    for (int64_t g = 0; g < 1000; ++g)
        same += mix_source_of_row(1234, g, cumulative) == mix_source_of_row(7, g, cumulative);
    EXPECT_LT(same, 900);
}

TEST(MixSources, RanksTogetherReadOneProcessRows) {
    const std::string dir = fresh_dir("ranks");
    const JobConfig cfg = mix_job(dir, "token_mean");
    const int64_t rows = 8, seq = cfg.train.seq_len;
    auto tensor = [&](int64_t r) { return core::Tensor::zeros({r, seq}, core::DType::i32); };
    MixedSource one(cfg, false);
    const core::Tensor in = tensor(rows), tg = tensor(rows);
    nn::VisionBatch images;
    std::vector<int32_t> sources;
    one.fill(0, rows, in, tg, &images, &sources);
    EXPECT_EQ(std::set<int32_t>(sources.begin(), sources.end()).size(), 2u) << "both sources in 8 rows";
    // Two data-parallel ranks, each with its own source objects, read rows [0, 4) and [4, 8) (sampler_first_sample of
    // one micro-batch of 4 rows); the same rows, sources and images, in the same order.
    std::vector<float> patches;
    std::vector<nn::ImageGrid> grids;
    for (int64_t rank = 0; rank < 2; ++rank) {
        MixedSource part(cfg, false);
        const core::Tensor pin = tensor(4), ptg = tensor(4);
        nn::VisionBatch pimages;
        std::vector<int32_t> psources;
        const int64_t first = data::sampler_first_sample(0, 1, 0, 2, rank, 4);
        part.fill(first, 4, pin, ptg, &pimages, &psources);
        for (int64_t r = 0; r < 4; ++r) {
            EXPECT_EQ(psources[static_cast<size_t>(r)], sources[static_cast<size_t>(first + r)]);
            for (int64_t j = 0; j < seq; ++j) {
                ASSERT_EQ(pin.data<int32_t>()[r * seq + j], in.data<int32_t>()[(first + r) * seq + j]);
                ASSERT_EQ(ptg.data<int32_t>()[r * seq + j], tg.data<int32_t>()[(first + r) * seq + j]);
            }
        }
        if (pimages.empty()) continue;
        patches.insert(
            patches.end(), pimages.patches.data<float>(), pimages.patches.data<float>() + pimages.patches.numel());
        grids.insert(grids.end(), pimages.grids.begin(), pimages.grids.end());
    }
    ASSERT_EQ(grids.size(), images.grids.size());
    for (size_t i = 0; i < grids.size(); ++i)
        EXPECT_EQ(grids[i].h * 1000 + grids[i].w, images.grids[i].h * 1000 + images.grids[i].w);
    ASSERT_EQ(static_cast<int64_t>(patches.size()), images.patches.numel());
    for (size_t i = 0; i < patches.size(); ++i) ASSERT_EQ(patches[i], images.patches.data<float>()[i]);
}

TEST(TrainerMix, OneSourceWithTokenMeanIsThePlainRunBitwise) {
    const std::string dir = fresh_dir("plain");
    const JobConfig plain = mt::testing::tiny_job(dir);
    std::string toml = "[run]\ndir = \"" + dir + "/run2\"\nseed = 7\nthreads = 2\n" +
                       "[model]\nvocab_size = 61\nd_model = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\n"
                       "d_ff = 64\nmax_seq_len = 64\ntie_embeddings = false\n"
                       "[data]\ndocument_mask = false\n"
                       "[train]\nsteps = 8\nbatch_size = 4\nseq_len = 16\ngrad_accum = 2\nlr = 1e-2\n"
                       "warmup_steps = 2\neval_every = 0\neval_batches = 2\n"
                       "[checkpoint]\nevery_steps = 0\n"
                       "[[data.sources]]\nname = \"text\"\nformat = \"llmc\"\nweight = 1\npaths = [\"" +
                       dir + "/train.bin\"]\nval_paths = [\"" + dir + "/val.bin\"]\n";
    const JobConfig mixed = config_parse(toml, dir + "/mixed.toml", {});
    Trainer a(plain, false), b(mixed, false);
    for (int s = 0; s < 4; ++s) {
        const StepResult ra = a.train_step(), rb = b.train_step();
        EXPECT_EQ(ra.loss, rb.loss) << "step " << s + 1;
        EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << s + 1;
        ASSERT_EQ(rb.source_tokens.size(), 1u);
        EXPECT_NEAR(rb.source_loss_sum[0] / rb.source_tokens[0], rb.loss, 1e-5 * rb.loss);
        EXPECT_EQ(rb.source_weight[0], 1.0);
    }
    EXPECT_EQ(a.evaluate(), b.evaluate());
}

TEST(TrainerMix, RowWeightsScaleEachRowsLossAndGradient) {
    const std::string dir = fresh_dir("rows");
    Trainer trainer(mt::testing::tiny_job(dir), false);
    nn::Model& model = trainer.model();
    const int64_t rows = 4, seq = 16;
    const core::Tensor ids = core::Tensor::zeros({rows, seq}, core::DType::i32), targets = ids.clone();
    for (int64_t i = 0; i < rows * seq; ++i) {
        ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 61);
        targets.data<int32_t>()[i] = i % 5 == 4 ? nn::kIgnoreIndex : static_cast<int32_t>((i * 11 + 1) % 61);
    }
    nn::ParamTable& table = model.params();
    auto grads = [&](std::vector<double> weights, double* loss, std::vector<double>* row_sums) {
        table.zero_grads();
        model.set_row_loss_weights(std::move(weights));
        *loss = model.forward(ids, targets);
        if (row_sums != nullptr) {
            const core::Tensor& l = model.last_token_losses();
            row_sums->assign(rows, 0.0);
            for (int64_t i = 0; i < rows * seq; ++i)
                (*row_sums)[static_cast<size_t>(i / seq)] += core::tensor_get_flat(l, i);
        }
        model.backward(1.0);
        std::vector<double> g;
        for (int p = 0; p < table.size(); ++p)
            for (int64_t j = 0; j < table.grad(p).numel(); ++j) g.push_back(core::tensor_get_flat(table.grad(p), j));
        return g;
    };
    double plain_loss = 0, loss = 0, part_loss = 0;
    std::vector<double> sums;
    const std::vector<double> plain = grads({}, &plain_loss, &sums);
    const double counted = static_cast<double>(model.last_counted_tokens());
    // Doubling every row's weight doubles the loss and every gradient exactly (a power of two).
    const std::vector<double> doubled = grads({2, 2, 2, 2}, &loss, nullptr);
    EXPECT_EQ(loss, 2 * plain_loss);
    for (size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(doubled[i], 2 * plain[i]) << i;
    // Weights (0.5, 3, 0, 1.25): the loss is sum_b w_b S_b / counted, and the gradient the same sum of each row's.
    const std::vector<double> w = {0.5, 3.0, 0.0, 1.25};
    const std::vector<double> weighted = grads(w, &loss, nullptr);
    double expect = 0;
    for (size_t b = 0; b < w.size(); ++b) expect += w[b] * sums[b];
    EXPECT_NEAR(loss, expect / counted, 1e-6 * std::abs(loss));
    std::vector<double> sum(plain.size(), 0.0);
    for (size_t b = 0; b < w.size(); ++b) {
        std::vector<double> one(rows, 0.0);
        one[b] = w[b];
        const std::vector<double> g = grads(one, &part_loss, nullptr);
        for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
        diff += (weighted[i] - sum[i]) * (weighted[i] - sum[i]);
        norm += weighted[i] * weighted[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-5);
    model.set_row_loss_weights({});
}

class TrainerMixWeighting : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainerMixWeighting, TextAndShapesTrainLogEverySourceAndResumeExactly) {
    const std::string dir = fresh_dir(GetParam());
    std::vector<double> straight;
    std::vector<double> weights_seen;
    {
        Trainer trainer(mix_job(dir + "/straight", GetParam()), false);
        for (int s = 0; s < 4; ++s) {
            const StepResult r = trainer.train_step();
            straight.push_back(r.loss);
            ASSERT_EQ(r.source_tokens.size(), 2u);
            EXPECT_GT(r.source_tokens[0] + r.source_tokens[1], 0);
            weights_seen.insert(weights_seen.end(), r.source_weight.begin(), r.source_weight.end());
            EXPECT_TRUE(std::isfinite(r.loss));
        }
    }
    if (std::string(GetParam()) != "token_mean") {
        // The weights move off 1 (uncertainty and gradnorm: every step; dwa, window 1: from the third step on).
        EXPECT_NE(weights_seen.back(), 1.0) << GetParam();
    }
    std::vector<double> resumed;
    {
        Trainer trainer(mix_job(dir + "/split", GetParam()), false);
        for (int s = 0; s < 2; ++s) resumed.push_back(trainer.train_step().loss);
        trainer.save_checkpoint();
    }
    {
        Trainer trainer(mix_job(dir + "/split", GetParam()), false);
        ASSERT_TRUE(trainer.resume_latest());
        while (trainer.step() < 4) resumed.push_back(trainer.train_step().loss);
    }
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Weightings,
                         TrainerMixWeighting,
                         ::testing::Values("token_mean", "uncertainty", "gradnorm", "dwa"));

TEST(TrainerMix, RunLogsLossPerSourceAndEvalPerSource) {
    const std::string dir = fresh_dir("run");
    Trainer trainer(mix_job(dir, "uncertainty", {"train.steps=4", "metrics.every=1", "train.eval_every=2"}), false);
    trainer.run();
    std::ifstream in(dir + "/run/metrics.jsonl");
    int train_lines = 0, eval_lines = 0;
    std::set<std::string> logged;
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        for (const auto& [key, value] : j.items()) logged.insert(key);
        if (j.at("kind") == "train") {
            ++train_lines;
            EXPECT_TRUE(j.contains("loss_weight/text") && j.contains("loss_weight/shapes")) << line;
        }
        if (j.at("kind") == "eval") {
            ++eval_lines;
            EXPECT_TRUE(j.contains("eval/text/loss") && j.contains("eval/shapes/loss")) << line;
            EXPECT_TRUE(std::isfinite(j.at("val_loss").get<double>()));
        }
    }
    EXPECT_EQ(train_lines, 4);
    EXPECT_EQ(eval_lines, 2);
    EXPECT_TRUE(logged.contains("loss/text"));
    EXPECT_TRUE(logged.contains("loss/shapes"));
}

// data.loader_threads is one setting of the job, not a source key: every source's loader takes it.
TEST(TrainerMix, LoaderThreadsIsOneJobWideSetting) {
    const JobConfig c = mix_job(fresh_dir("threads"), "token_mean", {"data.loader_threads=3"});
    EXPECT_EQ(c.data.loader_threads, 3);
    ASSERT_EQ(c.data_sources.size(), 2u);
    for (const DataSource& s : c.data_sources) EXPECT_EQ(s.data.loader_threads, 3) << s.name;
}

TEST(TrainerMix, ConfigRefusesBadSourcesNamingTheField) {
    const std::string dir = fresh_dir("refuse");
    const std::string base = read_file(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny.toml");
    const std::string text = write_shapes_text(dir);
    auto source = [&](const std::string& name, const std::string& body) {
        return "[[data.sources]]\nname = \"" + name + "\"\n" + body + "\n";
    };
    const std::string good_text = "format = \"llmc\"\npaths = [\"" + text + "\"]";
    auto refused = [&](const std::string& sources, const std::string& needle) {
        try {
            config_parse(base + "\n" + sources, dir + "/job.toml", {"run.dir=\"" + dir + "/run\""});
            ADD_FAILURE() << "accepted: " << needle;
        } catch (const core::Error& e) {
            EXPECT_EQ(e.code(), core::ExitCode::usage) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    refused(source("a", "format = \"csv\"\npaths = [\"x\"]"), "data.format = \"csv\"");
    refused(source("a", good_text + "\nweight = 0"), "data.sources[0].weight = 0");
    refused(source("a", good_text + "\nweight = -2"), "data.sources[0].weight = -2");
    refused(source("a", good_text) + source("a", "format = \"shapes\""), "data.sources[1].name = \"a\" is a duplicate");
    refused("[[data.sources]]\n" + good_text + "\n", "data.sources[0].name is missing");
    refused(source("a", good_text + "\nlr = 3"), "data.sources[0].lr");
    refused(source("a", good_text) + source("b", good_text + "\ntokenizer = \"gpt2\""), "data.sources[1].tokenizer");
    refused(source("a", "format = \"webdataset\"\npaths = [\"x.tar\"]") + source("b", "format = \"shapes\""),
            "data.sources[0].format = \"webdataset\"");
    refused(source("a", good_text) + "[loss]\nweighting = \"softmax\"\n", "loss.weighting");
    refused(source("a", good_text + "\nloader_threads = 2"), "data.sources[0].loader_threads");
    try {
        config_parse(base + "\n[loss]\nweighting = \"dwa\"\n", dir + "/job.toml", {"run.dir=\"" + dir + "/run\""});
        ADD_FAILURE() << "loss weighting without sources accepted";
    } catch (const core::Error& e) {
        EXPECT_NE(std::string(e.what()).find("loss.weighting = \"dwa\""), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace mt::train
