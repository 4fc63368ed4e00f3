// Per-modality MoE routing in the trainer (multimodal.md §4, docs/multimodal.md "Per-modality routing"): a shrunk
// configs/shapes_tiny_moe.toml trains with moe.modality_bias = "balanced" and "learned" and resumes bit for bit from a
// checkpoint (both balancer states, the learned offsets and their AdamW moments); the run writes exactly the metric
// keys its registry declares, per-modality ones included; the learned offsets move; the config refuses the option
// without image data or with a balancer it cannot split (exit 2 naming the key); Prometheus shows the modality as a
// label.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "support/run_files.h"
#include "support/tiny_job.h"
#include "train/metric_registry.h"
#include "train/prometheus.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;

JobConfig modality_job(const std::string& dir, std::vector<std::string> overrides = {}) {
    std::vector<std::string> o = {"run.dir=\"" + dir + "\"",
                                  "run.device=\"cpu\"",
                                  "run.threads=2",
                                  "train.batch_size=2",
                                  "train.seq_len=192",
                                  "train.eval_batches=1",
                                  "train.eval_every=3",
                                  "checkpoint.every_steps=0",
                                  "metrics.every=1",
                                  "moe.log_loads_every=2",
                                  "vision.layers=1",
                                  "vision.dim=32",
                                  "vision.heads=2",
                                  "vision.mlp=64"};
    o.insert(o.end(), overrides.begin(), overrides.end());
    return config_load(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny_moe.toml", o);
}

std::vector<double> losses(Trainer& t, int64_t until) {
    std::vector<double> out;
    while (t.step() < until) out.push_back(t.train_step().loss);
    return out;
}

void trains_and_resumes_bitwise(const std::string& bias) {
    const std::string dir = fresh_dir(bias);
    const std::string set = "moe.modality_bias=\"" + bias + "\"";
    std::vector<double> straight;
    {
        Trainer t(modality_job(dir + "/straight", {set}), false);
        straight = losses(t, 5);
        if (bias == "learned") {  // c_m moved from 0
            nn::ParamTable& table = t.model().params();
            const int c = table.find("layers.1.moe.router.modality_bias");
            ASSERT_GE(c, 0);
            double sq = 0;
            for (int64_t i = 0; i < table.param(c).numel(); ++i)
                sq += core::tensor_get_flat(table.param(c), i) * core::tensor_get_flat(table.param(c), i);
            EXPECT_GT(sq, 0.0);
        } else {
            nn::MoeLayer* moe = t.model().moe_layers().at(0).second;
            ASSERT_EQ(moe->num_balancers(), 2);
            EXPECT_NE(moe->balancer(0).bias(), moe->balancer(1).bias());
        }
    }
    std::vector<double> resumed;
    {
        Trainer t(modality_job(dir + "/split", {set}), false);
        resumed = losses(t, 2);
        t.save_checkpoint();
    }
    {
        Trainer t(modality_job(dir + "/split", {set}), false);
        ASSERT_TRUE(t.resume_latest());
        for (double l : losses(t, 5)) resumed.push_back(l);
    }
    ASSERT_EQ(resumed.size(), straight.size());
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << bias << " step " << i + 1;
}

TEST(TrainerModality, BalancedTrainsAndResumesBitwise) {
    trains_and_resumes_bitwise("balanced");
}

TEST(TrainerModality, LearnedTrainsAndResumesBitwise) {
    trains_and_resumes_bitwise("learned");
}

// The run writes exactly the keys its registry declares (the per-modality ones among them) and no others.
TEST(TrainerModality, WritesExactlyTheDeclaredKeys) {
    const std::string dir = fresh_dir("keys");
    const JobConfig cfg = modality_job(dir, {"train.steps=2", "moe.capacity_factor=1.0"});
    Trainer t(cfg, false);
    t.run();
    auto written = mt::testing::metrics_keys(dir + "/metrics.jsonl");  // line kind -> keys
    std::map<std::string, std::set<std::string>> declared;
    for (const MetricDef& d : metric_registry(cfg)) {
        declared[d.line].insert(d.key);
        if (d.when.empty()) {
            EXPECT_TRUE(written[d.line].count(d.key)) << "declared but never written: " << d.key;
        }
    }
    for (const auto& [kind, keys] : written)
        for (const auto& k : keys) EXPECT_TRUE(declared[kind].count(k)) << kind << " key not declared: " << k;
    for (const char* key : {"moe/modality/image/max_vio/l01",
                            "moe/modality/text/load_var/l01",
                            "moe/modality/image/token_share/l01",
                            "moe/modality/text/drop_rate/l01",
                            "moe/modality/image/load/l01",
                            "moe/image_share/l01",
                            "moe/expert_image_share_p50/l01"})
        EXPECT_TRUE(written["train"].count(key)) << key;
    // A text model declares none of them.
    const JobConfig text = mt::testing::tiny_job(fresh_dir("text"), {"moe.enabled=true", "moe.first_k_dense=1"});
    for (const MetricDef& d : metric_registry(text)) EXPECT_EQ(d.key.find("modality"), std::string::npos) << d.key;
}

TEST(TrainerModality, ConfigRefusesWithoutImagesOrSplittableBalancer) {
    const std::string dir = fresh_dir("refuse");
    auto refused = [&](const std::vector<std::string>& o, bool shapes, const std::string& msg) {
        try {
            if (shapes)
                modality_job(dir, o);
            else
                mt::testing::tiny_job(dir, o);
            ADD_FAILURE() << "accepted: " << msg;
        } catch (const core::Error& e) {
            EXPECT_EQ(e.code(), core::ExitCode::usage) << e.what();
            EXPECT_NE(std::string(e.what()).find("moe.modality_bias"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
        }
    };
    refused({"moe.enabled=true", "moe.first_k_dense=1", "moe.modality_bias=\"balanced\""}, false, "image");
    refused({"moe.enabled=true", "moe.first_k_dense=1", "moe.modality_bias=\"learned\""}, false, "vision");
    refused({"moe.balance=\"aux_loss\""}, true, "moe.balance");
    refused({"moe.enabled=false"}, true, "moe.enabled");
    modality_job(dir, {"moe.balance=\"aux_loss\"", "moe.modality_bias=\"learned\""});  // learned: any balancer
    modality_job(dir, {"moe.balance=\"sign_bias\""});
}

TEST(TrainerModality, PrometheusShowsTheModalityAsALabel) {
    const PrometheusSeries s = prometheus_series("moe/modality/image/max_vio/l03");
    EXPECT_EQ(s.family, "moetrain_moe_modality_max_vio");
    EXPECT_EQ(s.labels, (std::vector<std::pair<std::string, std::string>>{{"layer", "3"}, {"modality", "image"}}));
    EXPECT_EQ(prometheus_series("moe/expert_image_share_p50/l01").family, "moetrain_moe_expert_image_share_p50");
}

}  // namespace
}  // namespace mt::train
