// The per-layer statistics of the metrics steps (metrics.layer_stats, nn/layer_stats.h), each against a value taken
// here from the model's own tensors: the update norm from the master weights before and after the step (f32 and
// bf16 moments, the offloaded optimizer, Muon), the weight and gradient norms, the activation RMS from the blocks'
// outputs (or the AttnRes mixes that follow each layer), the KDA gate's mean and saturation from the gate values the
// layer saved, and the AttnRes mix weights and entropy from the saved softmax weights. One micro-batch, so the saved
// tensors are the step's.
#include "nn/layer_stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "support/tiny_job.h"
#include "train/trainer.h"

namespace {

using mt::core::Tensor;

std::vector<std::string> hybrid(std::vector<std::string> more = {}) {
    std::vector<std::string> o = {"model.layer_pattern=\"KA\"",
                                  "model.n_layers=4",
                                  "moe.enabled=true",
                                  "moe.num_experts=4",
                                  "moe.top_k=2",
                                  "moe.expert_ffn_dim=16",
                                  "moe.first_k_dense=1",
                                  "train.grad_accum=1"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
}

double get(const Tensor& t, int64_t i) {
    return mt::core::tensor_get_flat(t, i);
}

// sum of squares and count of a tensor, in f64.
std::pair<double, double> sum_sq(const Tensor& t) {
    double s = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) s += get(t, i) * get(t, i);
    return {s, static_cast<double>(t.numel())};
}

const Tensor& saved(std::vector<mt::nn::SavedTensor> list, const std::string& name) {
    for (const auto& s : list)
        if (s.name == name) return *s.tensor;
    ADD_FAILURE() << "no saved tensor " << name;
    static const Tensor none;
    return none;
}

// The update norm, and the weight and gradient norms beside it: the weights' after the step (from AdamW's own pass
// where it updates every weight, from a pass over the master weights under Muon or after QK-clip), the gradient's as
// the step reduced it (from the global norm's pass).
void expect_update_norms(const std::vector<std::string>& more, const char* what) {
    const std::string dir = mt::testing::fresh_dir(what);
    mt::train::Trainer t(mt::testing::tiny_job(dir, hybrid(more)), false);
    t.train_step();
    const auto& table = t.model().params();
    std::vector<Tensor> before;
    for (int i = 0; i < table.size(); ++i) before.push_back(table.master(i).clone());
    const mt::train::StepResult r = t.train_step();
    ASSERT_EQ(r.layer_update_sq.size(), 4u) << what;
    ASSERT_EQ(r.layer_param_sq.size(), 4u) << what;
    ASSERT_EQ(r.layer_grad_sq.size(), 4u) << what;
    std::vector<double> want(4, 0.0), want_param(4, 0.0), want_grad(4, 0.0);
    double all_grad = 0.0;
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        const auto [grad_sq, n] = sum_sq(table.grad(i));
        all_grad += grad_sq;
        if (name.rfind("layers.", 0) != 0) continue;
        const Tensor& after = table.master(i);
        double sq = 0.0;
        for (int64_t k = 0; k < after.numel(); ++k) {
            const double d = get(after, k) - get(before[static_cast<size_t>(i)], k);
            sq += d * d;
        }
        const size_t l = std::stoul(name.substr(7));
        want[l] += sq;
        want_param[l] += sum_sq(after).first;
        want_grad[l] += grad_sq;
    }
    for (size_t l = 0; l < 4; ++l) {
        EXPECT_GT(want[l], 0.0) << what << " layer " << l;
        // QK-clip's rescaling after the update is not the optimizer's change (update_norm is the update's).
        if (r.optim.qk_clipped_heads == 0) {
            EXPECT_NEAR(r.layer_update_sq[l], want[l], 1e-9 * want[l]) << what << " layer " << l;
        }
        EXPECT_NEAR(r.layer_param_sq[l], want_param[l], 1e-12 * want_param[l]) << what << " layer " << l;
        EXPECT_NEAR(r.layer_grad_sq[l], want_grad[l], 1e-12 * want_grad[l]) << what << " layer " << l;
    }
    EXPECT_NEAR(r.grad_norm, std::sqrt(all_grad), 1e-12 * std::sqrt(all_grad)) << what;
    EXPECT_EQ(r.optim.qk_clipped_heads > 0, std::string(what) == "qk_clipped") << what;
}

}  // namespace

TEST(LayerStats, UpdateNormIsTheChangeOfTheMasterWeights) {
    expect_update_norms({}, "f32");
    expect_update_norms({"optim.state_dtype=\"bf16\""}, "bf16_moments");
    expect_update_norms({"optim.offload=\"cpu\""}, "offload");
    expect_update_norms({"optim.name=\"muon\""}, "muon");
    expect_update_norms({"optim.qk_clip_tau=1e-3"}, "qk_clipped");  // every head clipped after the update
}

TEST(LayerStats, NothingIsCollectedOffTheMetricsSteps) {
    const std::string dir = mt::testing::fresh_dir("x");
    mt::train::Trainer t(mt::testing::tiny_job(dir, hybrid({"metrics.every=2"})), false);
    EXPECT_TRUE(t.train_step().layer_stats.empty());
    EXPECT_FALSE(t.train_step().layer_stats.empty());
}

// The plain residual stream: each block's output; the KDA layers' gate values g, under both gates (each with its
// saturation threshold; at this initialisation few or no values reach it: OpCheck.layer_stats_* counts nonzero ones).
static void expect_activations_and_gates(const std::string& gate) {
    const std::string dir = mt::testing::fresh_dir(gate);
    const auto cfg = mt::testing::tiny_job(dir, hybrid({"kda.gate=\"" + gate + "\""}));
    mt::train::Trainer t(cfg, false);
    const mt::train::StepResult r = t.train_step();
    const mt::nn::LayerStatsLayout s = mt::nn::layer_stats_layout(cfg.model);
    ASSERT_EQ(r.layer_stats.size(), static_cast<size_t>(s.size));
    auto slot = [&](int64_t i) { return r.layer_stats[static_cast<size_t>(i)]; };
    const double low = gate == "softplus" ? -5.0 : 0.99 * cfg.model.kda.gate_lower_bound;
    for (int64_t l = 0; l < 4; ++l) {
        mt::nn::Block& b = t.model().block_at(l);
        const auto [sq, n] = sum_sq(b.output());
        EXPECT_EQ(slot(s.act(l)), n) << "layer " << l;
        EXPECT_NEAR(std::sqrt(slot(s.act(l) + 2) / slot(s.act(l))), std::sqrt(sq / n), 1e-12 * std::sqrt(sq / n))
            << "layer " << l;
        if (!cfg.model.layer_is_kda(l)) {
            EXPECT_EQ(slot(s.kda_gate(l)), 0.0) << "an attention layer has no gate";
            continue;
        }
        const Tensor& g = saved(b.saved_for_backward(), "kda.g");
        double sum = 0.0, sat = 0.0;
        for (int64_t i = 0; i < g.numel(); ++i) {
            sum += get(g, i);
            sat += get(g, i) <= low ? 1.0 : 0.0;
        }
        const auto count = static_cast<double>(g.numel());
        EXPECT_EQ(slot(s.kda_gate(l)), count) << "layer " << l;
        EXPECT_NEAR(slot(s.kda_gate(l) + 1) / count, sum / count, 1e-12) << "layer " << l;
        EXPECT_LT(sum / count, 0.0);
        EXPECT_EQ(slot(s.kda_gate(l) + 3), sat) << "layer " << l;
    }
}

TEST(LayerStats, ActivationRmsAndKdaGateAreTheLayersTensors) {
    expect_activations_and_gates("lower_bound");
    expect_activations_and_gates("softplus");
}

// Block AttnRes: the mixes' softmax weights alpha (per source mean, entropy / ln m) and, as each layer's activation,
// the mix that follows its FFN sub-layer.
TEST(LayerStats, AttnResMixWeightsAndEntropyAreTheSavedAlphas) {
    const std::string dir = mt::testing::fresh_dir("x");
    const auto cfg = mt::testing::tiny_job(dir, hybrid({"attnres.mode=\"block\"", "attnres.block_size=3"}));
    mt::train::Trainer t(cfg, false);
    t.train_step();  // the queries start at zero (uniform weights): the second step's are learned
    const mt::train::StepResult r = t.train_step();
    const mt::nn::LayerStatsLayout s = mt::nn::layer_stats_layout(cfg.model);
    ASSERT_EQ(s.mix_sources.size(), 9u);
    const auto model_saved = t.model().saved_for_backward();
    auto slot = [&](int64_t i) { return r.layer_stats[static_cast<size_t>(i)]; };
    for (int64_t l = 0; l <= 8; ++l) {
        const Tensor& alpha = saved(model_saved, "attnres.alpha." + std::to_string(l));
        const int64_t rows = alpha.size(0), m = alpha.size(1), base = s.mix(l);
        ASSERT_EQ(m, s.mix_sources[static_cast<size_t>(l)]);
        EXPECT_EQ(slot(base), static_cast<double>(rows));
        double entropy = 0.0;
        for (int64_t j = 0; j < m; ++j) {
            double col = 0.0;
            for (int64_t n = 0; n < rows; ++n) col += get(alpha, n * m + j);
            EXPECT_NEAR(slot(base + 1 + j) / rows, col / rows, 1e-12) << "mix " << l << " source " << j;
        }
        for (int64_t n = 0; n < rows; ++n)
            for (int64_t j = 0; j < m; ++j) {
                const double a = get(alpha, n * m + j);
                entropy -= a > 0 ? a * std::log(a) : 0.0;
            }
        EXPECT_NEAR(slot(base + 1 + m) / rows, entropy / rows, 1e-12) << "mix " << l;
        if (m > 1) {
            EXPECT_GT(entropy, 0.0);
        }
        if (l < 2 || l % 2 != 0) continue;
        const auto [sq, n] = sum_sq(saved(model_saved, "attnres.mixed." + std::to_string(l)));
        const int64_t act = s.act(l / 2 - 1);
        EXPECT_EQ(slot(act), n);
        EXPECT_NEAR(slot(act + 2) / slot(act), sq / n, 1e-12 * sq / n) << "layer " << l / 2 - 1;
    }
}
