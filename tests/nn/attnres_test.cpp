// Block Attention Residuals in the whole model (spec attnres.md §11.1, §11.4): with frozen zero queries and eps = 0
// the model is exactly the plain pre-norm model (logits, loss and every shared gradient), for block sizes that do and
// do not divide L; with trainable queries at step 0 only the queries get AttnRes gradients; parameter names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "nn/dense_lm.h"

using mt::core::DType;
using mt::core::Tensor;
using mt::nn::DenseLM;
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

ModelRun run(const ModelConfig& cfg) {
    DenseLM model(cfg, mt::nn::Precision::cpu(DType::f64));
    model.params().initialize(5);  // per-name draws: the shared parameters are equal in both models
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

double rho(const Tensor& a, const Tensor& b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
        const double x = mt::core::tensor_get_flat(a, i), y = mt::core::tensor_get_flat(b, i);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace

TEST(AttnRes, FrozenZeroQueriesEqualThePlainModel) {
    const ModelRun plain = run(base_config());
    for (const auto& [mode, s] : std::vector<std::pair<std::string, int64_t>>{
             {"full", 1}, {"block", 2}, {"block", 3}, {"block", 4}, {"block", 6}, {"block", 100}}) {
        ModelConfig c = base_config();
        c.attnres.mode = mode;
        c.attnres.block_size = s;
        c.attnres.freeze_queries = true;
        const ModelRun ar = run(c);
        EXPECT_LE(std::abs(ar.loss - plain.loss) / plain.loss, 1e-12) << mode << " S=" << s;
        double worst = 0;
        int shared = 0;
        for (const auto& [name, g] : plain.grads)
            for (const auto& [name2, g2] : ar.grads)
                if (name == name2) {
                    worst = std::max(worst, rho(g2, g));
                    ++shared;
                    EXPECT_LE(rho(g2, g), 1e-12) << mode << " S=" << s << ": " << name;
                }
        EXPECT_EQ(shared, static_cast<int>(plain.grads.size()));
        for (const auto& [name, g] : ar.grads) {
            if (name.rfind("attnres.", 0) != 0) continue;
            for (int64_t i = 0; i < g.numel(); ++i) {
                ASSERT_EQ(mt::core::tensor_get_flat(g, i), 0.0) << name << " (frozen queries, zero key-norm grad)";
            }
        }
        std::printf("[ ATTNRES ] %s S=%lld: loss %.15f vs plain %.15f, worst shared-gradient rho %.2e\n",
                    mode.c_str(),
                    static_cast<long long>(s),
                    ar.loss,
                    plain.loss,
                    worst);
    }
}

TEST(AttnRes, AtStepZeroOnlyTheQueriesHaveAttnResGradients) {
    ModelConfig c = base_config();
    c.norm_eps = 1e-5;
    c.attnres.mode = "block";
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
    c.attnres.mode = "block";
    c.attnres.block_size = 4;
    DenseLM model(c, mt::nn::Precision::cpu(DType::f64));
    EXPECT_GE(model.params().find("attnres.mix.1.query"), 0);
    EXPECT_GE(model.params().find("attnres.mix.7.key_norm"), 0);  // L + 1 = 7: the final mix
    EXPECT_LT(model.params().find("attnres.mix.8.query"), 0);
}
