// Block Attention Residuals in the whole model (spec attnres.md §11.1, §11.4): with frozen zero queries and eps = 0
// the model is exactly the plain pre-norm model (logits, loss and every shared gradient), for block sizes that do and
// do not divide L; with trainable queries at step 0 only the queries get AttnRes gradients; parameter names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"

using mt::core::DType;
using mt::core::Tensor;
using mt::nn::AttnResMode;
using mt::nn::enum_name;
using mt::nn::Model;
using mt::nn::ModelConfig;

namespace {

ModelConfig base_config() {
    ModelConfig c;
    c.vocab_size = 19;
    c.d_model = 8;
    c.n_layers = 3;  // L = 6 sub-layers
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.d_ff = 12;
    c.max_seq_len = 16;
    c.tie_embeddings = false;
    c.init_std = 0.3;
    c.norm_eps = 0.0;  // §4: exact equivalence needs eps = 0 (RMSNorm(x / m) = RMSNorm(x) only then)
    return c;
}

struct ModelRun {
    double loss;
    std::vector<std::pair<std::string, Tensor>> grads;  // by name
};

// MoE FFNs in layers 1 and 2 (4 experts, top 2, a shared expert): AttnRes works with every layer type.
ModelConfig with_moe(ModelConfig c) {
    c.moe_enabled = true;
    c.moe_first_k_dense = 1;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.expert_ffn_dim = 6;
    c.moe.routed_scale = 1.0;
    return c;
}

// step: the optimizer step the model is told (the residual blend's schedule); random_queries: draw the
// pseudo-queries from N(0, 0.5^2) instead of their zero init.
ModelRun run(const ModelConfig& cfg, int64_t step = 0, bool random_queries = false) {
    Model model(cfg, mt::nn::Precision::cpu(DType::f64));
    model.params().initialize(5);  // per-name draws: the shared parameters are equal in both models
    model.set_train_step(step);
    for (int i = 0; random_queries && i < model.params().size(); ++i) {
        const std::string& name = model.params().spec(i).name;
        if (name.size() > 6 && name.compare(name.size() - 6, 6, ".query") == 0)
            mt::core::rng_fill_normal(model.params().param(i), 17, static_cast<uint64_t>(i), 0.0, 0.5);
    }
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        mt::core::tensor_set_flat(ids, i, static_cast<double>(mt::core::rng_u64(3, 1, i) % cfg.vocab_size));
        mt::core::tensor_set_flat(targets, i, static_cast<double>(mt::core::rng_u64(3, 2, i) % cfg.vocab_size));
    }
    model.params().zero_grads();
    ModelRun r{model.forward(ids, targets), {}};
    model.backward(1.0);
    for (int i = 0; i < model.params().size(); ++i)
        r.grads.emplace_back(model.params().spec(i).name, model.params().grad(i).clone());
    return r;
}

// The worst rho over the gradients both runs have; every plain gradient must have its counterpart.
double worst_shared_rho(const ModelRun& plain, const ModelRun& ar, const std::string& what) {
    double worst = 0;
    int shared = 0;
    for (const auto& [name, g] : plain.grads)
        for (const auto& [name2, g2] : ar.grads)
            if (name == name2) {
                worst = std::max(worst, mt::testing::rho(g2, g));
                ++shared;
                EXPECT_LE(mt::testing::rho(g2, g), 1e-12) << what << ": " << name;
            }
    EXPECT_EQ(shared, static_cast<int>(plain.grads.size())) << what;
    return worst;
}

}  // namespace

TEST(AttnRes, FrozenZeroQueriesEqualThePlainModel) {
    for (const bool moe : {false, true}) {
        const ModelConfig base = moe ? with_moe(base_config()) : base_config();
        const ModelRun plain = run(base);
        for (const auto& [mode, s] : std::vector<std::pair<AttnResMode, int64_t>>{{AttnResMode::full, 1},
                                                                                  {AttnResMode::block, 2},
                                                                                  {AttnResMode::block, 3},
                                                                                  {AttnResMode::block, 4},
                                                                                  {AttnResMode::block, 6},
                                                                                  {AttnResMode::block, 100}}) {
            ModelConfig c = base;
            c.attnres.mode = mode;
            c.attnres.block_size = s;
            c.attnres.freeze_queries = true;
            const ModelRun ar = run(c);
            const std::string what = (moe ? "moe " : "") + std::string(enum_name(mode)) + " S=" + std::to_string(s);
            EXPECT_LE(std::abs(ar.loss - plain.loss) / plain.loss, 1e-12) << what;
            const double worst = worst_shared_rho(plain, ar, what);
            for (const auto& [name, g] : ar.grads) {
                if (name.rfind("attnres.", 0) != 0) continue;
                for (int64_t i = 0; i < g.numel(); ++i) {
                    ASSERT_EQ(mt::core::tensor_get_flat(g, i), 0.0) << name << " (frozen queries, zero key-norm grad)";
                }
            }
            std::printf("[ ATTNRES ] %s: loss %.15f vs plain %.15f, worst shared-gradient rho %.2e\n",
                        what.c_str(),
                        ar.loss,
                        plain.loss,
                        worst);
        }
    }
}

// Spec §5 and §11.5: the residual blend at lambda = 1 is the plain pre-norm model (eps = 0) whatever the queries,
// and the AttnRes parameters then get no gradient; its linear schedule reaches lambda = 0 at residual_blend_steps,
// where the model is the unblended one bitwise.
TEST(AttnRes, ResidualBlendEndpoints) {
    for (const bool moe : {false, true}) {
        const ModelConfig base = moe ? with_moe(base_config()) : base_config();
        const ModelRun plain = run(base);
        ModelConfig c = base;
        c.attnres.mode = AttnResMode::block;
        c.attnres.block_size = 3;
        c.attnres.residual_blend = 1.0;
        const ModelRun blended = run(c, 0, /*random_queries=*/true);
        const std::string what = moe ? "moe blend 1" : "blend 1";
        EXPECT_LE(std::abs(blended.loss - plain.loss) / plain.loss, 1e-12) << what;
        worst_shared_rho(plain, blended, what);
        for (const auto& [name, g] : blended.grads) {
            if (name.rfind("attnres.", 0) != 0) continue;
            for (int64_t i = 0; i < g.numel(); ++i) {
                ASSERT_EQ(mt::core::tensor_get_flat(g, i), 0.0) << name;
            }
        }

        // lambda(t) = 0.8 max(0, 1 - t / 10): 0.4 at step 5, 0 from step 10 on.
        c.attnres.residual_blend = 0.8;
        c.attnres.residual_blend_steps = 10;
        EXPECT_DOUBLE_EQ(c.attnres.blend_at(5), 0.4);
        EXPECT_EQ(c.attnres.blend_at(12), 0.0);
        ModelConfig unblended = c;
        unblended.attnres.residual_blend = 0.0;
        const ModelRun at_end = run(c, 10, true), reference = run(unblended, 0, true);
        EXPECT_EQ(at_end.loss, reference.loss) << what;
        for (size_t i = 0; i < at_end.grads.size(); ++i)
            for (int64_t k = 0; k < at_end.grads[i].second.numel(); ++k)
                ASSERT_EQ(mt::core::tensor_get_flat(at_end.grads[i].second, k),
                          mt::core::tensor_get_flat(reference.grads[i].second, k))
                    << at_end.grads[i].first;
        // In between it is neither.
        EXPECT_NE(run(c, 5, true).loss, reference.loss);
    }
}

TEST(AttnRes, AtStepZeroOnlyTheQueriesHaveAttnResGradients) {
    ModelConfig c = base_config();
    c.norm_eps = 1e-5;
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 2;
    const ModelRun r = run(c);
    int queries = 0;
    for (const auto& [name, g] : r.grads) {
        if (name.rfind("attnres.", 0) != 0) continue;
        double norm = 0;
        for (int64_t i = 0; i < g.numel(); ++i) norm += std::abs(mt::core::tensor_get_flat(g, i));
        const bool is_query = name.size() > 6 && name.compare(name.size() - 6, 6, ".query") == 0;
        // The first mix has a single source (alpha = 1): its query gradient is exactly zero too.
        if (is_query && name != "attnres.mix.1.query") {
            EXPECT_GT(norm, 0.0) << name;
            ++queries;
        }
        if (!is_query) {
            EXPECT_EQ(norm, 0.0) << name << ": dgamma is proportional to w = 0";
        }
    }
    EXPECT_EQ(queries, 6);  // mixes 2..6 and the final mix 7
}

TEST(AttnRes, ParameterNames) {
    ModelConfig c = base_config();
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 4;
    Model model(c, mt::nn::Precision::cpu(DType::f64));
    EXPECT_GE(model.params().find("attnres.mix.1.query"), 0);
    EXPECT_GE(model.params().find("attnres.mix.7.key_norm"), 0);  // L + 1 = 7: the final mix
    EXPECT_LT(model.params().find("attnres.mix.8.query"), 0);
}
