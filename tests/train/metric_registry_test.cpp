// The metric registry (operations.md §6, docs/metrics.md): kimi_linear_mini declares 200+ metrics, each key once; a
// training of a tiny KDA/attention hybrid with MoE writes exactly the keys its registry declares (none undeclared,
// every unconditional one present); and the per-layer gradient and weight norms equal the norms of the layer's
// tensors taken directly.
#include "train/metric_registry.h"

#include <gtest/gtest.h>

#include <set>

#include "ops/global_norm.h"
#include "support/run_files.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace {

std::vector<std::string> hybrid_moe(std::vector<std::string> more = {}) {
    std::vector<std::string> o = {"model.layer_pattern=\"KA\"",
                                  "model.n_layers=4",
                                  "moe.enabled=true",
                                  "moe.num_experts=4",
                                  "moe.top_k=2",
                                  "moe.expert_ffn_dim=16",
                                  "moe.first_k_dense=1",
                                  "moe.log_loads_every=1",
                                  "train.eval_every=3"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
}

}  // namespace

TEST(MetricRegistry, KimiLinearMiniDeclaresMoreThan200MetricsOnce) {
    const auto cfg = mt::train::config_load(std::string(MT_SOURCE_DIR) + "/configs/kimi_linear_mini.toml");
    const auto defs = mt::train::metric_registry(cfg);
    EXPECT_GE(defs.size(), 200u);
    std::set<std::string> keys;
    for (const auto& d : defs) {
        EXPECT_TRUE(keys.insert(d.line + ":" + d.key).second) << "declared twice: " << d.key;
        EXPECT_FALSE(d.help.empty()) << d.key;
        EXPECT_TRUE(d.type == "gauge" || d.type == "counter" || d.type == "array") << d.key;
    }
    EXPECT_TRUE(keys.count("train:layer/15/grad_norm"));
    EXPECT_TRUE(keys.count("train:moe/n_eff/l15"));
    EXPECT_TRUE(keys.count("train:long/max_logit/l03"));  // KKKA: layer 3 is softmax attention
    EXPECT_TRUE(keys.count("train:long/kda_state_rms/l00"));
}

namespace {

// Trains a tiny KDA/attention MoE (hybrid_moe with the overrides) and expects its metrics.jsonl to hold exactly the
// keys the registry declares for it (every unconditional one). Returns the train lines' keys.
std::set<std::string> expect_written_as_declared(const std::vector<std::string>& overrides, const char* what) {
    const std::string dir = mt::testing::fresh_dir(what);
    const auto cfg = mt::testing::tiny_job(dir, hybrid_moe(overrides));
    mt::train::Trainer t(cfg, false);
    t.run();
    auto written = mt::testing::metrics_keys(dir + "/run/metrics.jsonl");  // line kind -> keys
    std::map<std::string, std::set<std::string>> declared;
    for (const auto& d : mt::train::metric_registry(cfg)) {
        declared[d.line].insert(d.key);
        if (d.when.empty()) {
            EXPECT_TRUE(written[d.line].count(d.key)) << what << ": declared but never written: " << d.key;
        }
    }
    for (const auto& [kind, keys] : written)
        for (const auto& k : keys)
            EXPECT_TRUE(declared[kind].count(k)) << what << ": " << kind << " line key not declared: " << k;
    return written["train"];
}

}  // namespace

TEST(MetricRegistry, ATrainingWritesExactlyTheDeclaredKeys) {
    const std::set<std::string> plain = expect_written_as_declared({"train.steps=3"}, "plain");
    EXPECT_TRUE(plain.count("layer/3/grad_norm"));
    EXPECT_TRUE(plain.count("moe/load/l01"));
    EXPECT_TRUE(plain.count("layer/3/update_ratio"));
    EXPECT_TRUE(plain.count("layer/2/kda_gate_sat"));
    EXPECT_FALSE(plain.count("layer/3/kda_gate_mean"));  // KAKA: layer 3 is softmax attention
    const std::set<std::string> attnres =
        expect_written_as_declared({"train.steps=2", "attnres.mode=\"block\"", "attnres.block_size=3"}, "attnres");
    EXPECT_TRUE(attnres.count("attnres/8/entropy"));
    EXPECT_TRUE(attnres.count("attnres/8/w3"));  // the final mix: the embedding and 3 blocks (3, 3, 2 sub-layers)
    EXPECT_FALSE(attnres.count("attnres/8/w4"));
    EXPECT_TRUE(attnres.count("layer/3/act_rms"));
}

// One process: each layer's norms from the trainer equal the norms of its tensors in the parameter table (the
// gradients as the last step left them, with no loss scale on the CPU; the master weights after the update).
TEST(MetricRegistry, LayerNormsAreTheLayersTensorsNorms) {
    const std::string dir = mt::testing::fresh_dir("x");
    mt::train::Trainer t(mt::testing::tiny_job(dir, hybrid_moe()), false);
    t.train_step();
    const mt::train::StepResult r = t.train_step();
    const auto& table = t.model().params();
    ASSERT_EQ(r.layer_grad_sq.size(), 4u);
    ASSERT_EQ(r.layer_param_sq.size(), 4u);
    std::vector<double> grad(4, 0.0), param(4, 0.0);
    double other = 0.0;
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        const double g = mt::ops::global_norm_sq(table.grad(i).reshape({table.grad(i).numel()}));
        if (name.rfind("layers.", 0) != 0) {
            other += g;
            continue;
        }
        const size_t l = std::stoul(name.substr(7));
        grad[l] += g;
        param[l] += mt::ops::global_norm_sq(table.master(i).reshape({table.master(i).numel()}));
    }
    double sum = other;
    for (size_t l = 0; l < 4; ++l) {
        EXPECT_NEAR(r.layer_grad_sq[l], grad[l], 1e-9 * grad[l]) << "layer " << l;
        EXPECT_NEAR(r.layer_param_sq[l], param[l], 1e-9 * param[l]) << "layer " << l;
        EXPECT_GT(grad[l], 0.0);
        sum += r.layer_grad_sq[l];
    }
    EXPECT_NEAR(std::sqrt(sum), r.grad_norm, 1e-6 * r.grad_norm) << "the layers and the rest make the global norm";
}
