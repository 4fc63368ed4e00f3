// Whole LM in f64, dense, hybrid (KDA + attention layers) and with Block AttnRes: finite-difference gradient check of
// every parameter tensor, the layer contract, parameter names and init, FLOPs.
#include "nn/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

using mt::core::DType;
using mt::core::Tensor;
using mt::nn::AttnResMode;
using mt::nn::Model;
using mt::nn::ModelConfig;
using mt::nn::MoeBalanceMode;

namespace {

ModelConfig small_config(bool tied) {
    ModelConfig c;
    c.vocab_size = 23;
    c.d_model = 12;
    c.n_layers = 2;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.d_ff = 20;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    c.init_std = 0.3;  // large enough that every path carries gradient
    return c;
}

// One KDA layer then one NoPE attention layer ("KA"), GVA in the KDA layer (1 q/k head, 2 value heads), T across
// a 32-token chunk; or "AK" with RoPE on the attention layer.
ModelConfig hybrid_config(const std::string& pattern, bool tied) {
    ModelConfig c = small_config(tied);
    c.layer_pattern = pattern;
    c.max_seq_len = 64;
    c.kda.num_heads = 1;
    c.kda.num_v_heads = 2;
    c.kda.head_dim = 4;
    c.kda.head_v_dim = 3;
    c.kda.chunk_size = 32;
    if (pattern == "AK") c.attn_pos = "rope";
    return c;
}

// Block Attention Residuals on top of a config: mode block with S sub-layers per block, or full (S = 1).
ModelConfig with_attnres(ModelConfig c, AttnResMode mode, int64_t block) {
    c.attnres.mode = mode;
    c.attnres.block_size = block;
    return c;
}

// MoE FFNs (moe.md): layers from first_k_dense on route to top_k of num_experts experts plus a shared expert.
ModelConfig with_moe(ModelConfig c, int64_t first_k_dense, MoeBalanceMode balance) {
    c.moe_enabled = true;
    c.moe_first_k_dense = first_k_dense;
    c.moe_dense_ffn_dim = 16;
    c.moe.num_experts = 5;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 6;
    c.moe.routed_scale = 1.5;
    c.moe.balance.mode = balance;
    c.moe.balance.aux_coeff = 0.3;  // large, so that a wrong aux gradient shows
    return c;
}

// Sliding-window attention (long_context.md §2) on `layer` (1-based): window w, g global tokens, the sink logit in
// every attention layer, RoPE base 500 on the window layer.
ModelConfig with_window(ModelConfig c, int64_t layer, int64_t w, int64_t g) {
    c.attn.window = w;
    c.attn.window_layers = {layer};
    c.attn.global_tokens = g;
    c.attn.sink_logit = true;
    c.attn.window_rope_base = 500.0;
    return c;
}

void random_batch(const Tensor& ids, const Tensor& targets, int64_t vocab) {
    for (int64_t i = 0; i < ids.numel(); ++i) {
        mt::core::tensor_set_flat(ids, i, static_cast<double>(mt::core::rng_u64(5, 1, i) % vocab));
        mt::core::tensor_set_flat(targets, i, static_cast<double>(mt::core::rng_u64(5, 2, i) % vocab));
    }
    mt::core::tensor_set_flat(targets, 3, mt::nn::kIgnoreIndex);
}

}  // namespace

struct GradCase {
    const char* name;
    ModelConfig cfg;
    int64_t seq;
};

class ModelGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(ModelGrad, FiniteDifferencesMatchBackward) {
    Model model(GetParam().cfg, mt::nn::Precision::cpu(DType::f64));
    model.params().initialize(11);
    // The objective backward differentiates: the LM loss plus, with moe.balance = aux_loss, the MoE aux losses.
    auto objective = [&](const Tensor& ids, const Tensor& targets) {
        const double lm = model.forward(ids, targets);
        return lm + model.last_aux_loss();
    };
    // Norm weights start at 1 (and A_log at 0); perturb the 1-D parameters so their gradients are generic.
    for (int i = 0; i < model.params().size(); ++i)
        if (model.params().spec(i).shape.size() == 1)
            mt::core::rng_fill_uniform(model.params().param(i), 3, static_cast<uint64_t>(i), 0.5, 1.5);
    const int64_t seq = GetParam().seq;
    Tensor ids = Tensor::zeros({2, seq}, DType::i32), targets = Tensor::zeros({2, seq}, DType::i32);
    random_batch(ids, targets, 23);

    model.params().zero_grads();
    model.forward(ids, targets);
    model.backward(1.0);
    const Tensor grads = model.params().grad_arena().clone();

    // Per tensor: 3 random directions over the whole tensor, then 4 random coordinates; central differences with
    // step h = 1e-6 max(1, max |w|). A probe passes with relative error < 1e-6, or when |numeric - analytic| is
    // below the difference's own rounding, 16 ulp(L) / (2h) (~5e-9 here): in the hybrid models many gradients
    // (and directional derivatives) are ~1e-3 to 1e-4, where that rounding alone is a relative 1e-6 to 1e-5.
    const double loss = objective(ids, targets);
    const double fd_noise = 16 * 2.2e-16 * std::abs(loss);
    double worst_dir = 0, worst_coord = 0;
    int floored = 0;
    for (int p = 0; p < model.params().size(); ++p) {
        const Tensor w = model.params().param(p);
        const Tensor orig = w.clone(), dir = Tensor::zeros(w.shape(), DType::f64);
        const int64_t base = model.params().offset(p);
        double max_abs = 0;
        for (int64_t i = 0; i < w.numel(); ++i) max_abs = std::max(max_abs, std::abs(mt::core::tensor_get_flat(w, i)));
        const double h = 1e-6 * std::max(1.0, max_abs);
        for (int k = 0; k < 7; ++k) {
            dir.zero();
            if (k < 3) {
                mt::core::rng_fill_normal(dir, 13, static_cast<uint64_t>(16 * p + k), 0.0, 1.0);
            } else {
                const auto i = static_cast<int64_t>(mt::core::rng_u64(9, static_cast<uint64_t>(p), k) % w.numel());
                mt::core::tensor_set_flat(dir, i, 1.0);
            }
            auto loss_at = [&](double step) {
                for (int64_t i = 0; i < w.numel(); ++i)
                    mt::core::tensor_set_flat(
                        w, i, mt::core::tensor_get_flat(orig, i) + step * mt::core::tensor_get_flat(dir, i));
                return objective(ids, targets);
            };
            const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
            w.copy_from(orig);
            double analytic = 0;
            for (int64_t i = 0; i < w.numel(); ++i)
                analytic += mt::core::tensor_get_flat(grads, base + i) * mt::core::tensor_get_flat(dir, i);
            const double diff = std::abs(numeric - analytic);
            const double err = diff / std::max(1e-300, std::abs(numeric) + std::abs(analytic));
            const bool below_noise = diff < fd_noise / (2 * h);
            if (err >= 1e-6 && below_noise)
                ++floored;
            else
                (k < 3 ? worst_dir : worst_coord) = std::max(k < 3 ? worst_dir : worst_coord, err);
            EXPECT_TRUE(err < 1e-6 || below_noise)
                << model.params().spec(p).name << (k < 3 ? " direction " : " coordinate ") << k << ": numeric "
                << numeric << " analytic " << analytic << ", relative error " << err;
        }
    }
    std::printf(
        "[ DENSE LM  ] %s: worst finite-difference error %.3e along directions, %.3e at coordinates, over %d tensors "
        "(%d more coordinates within the difference's rounding)\n",
        GetParam().name,
        worst_dir,
        worst_coord,
        model.params().size(),
        floored);
}

INSTANTIATE_TEST_SUITE_P(
    DenseHybridAndMoe,
    ModelGrad,
    ::testing::Values(
        GradCase{"tied", small_config(true), 7},
        GradCase{"untied", small_config(false), 7},
        GradCase{"hybrid_KA_nope", hybrid_config("KA", false), 37},
        GradCase{"hybrid_AK_rope", hybrid_config("AK", true), 37},
        GradCase{"attnres_block_s3", with_attnres(small_config(false), AttnResMode::block, 3), 7},
        GradCase{"attnres_full_tied", with_attnres(small_config(true), AttnResMode::full, 6), 7},
        GradCase{"attnres_hybrid_s2", with_attnres(hybrid_config("KA", false), AttnResMode::block, 2), 37},
        GradCase{"moe_quantile", with_moe(small_config(false), 1, MoeBalanceMode::quantile), 7},
        GradCase{"moe_aux_loss_tied", with_moe(small_config(true), 0, MoeBalanceMode::aux_loss), 7},
        GradCase{"window_global_sink", with_window(small_config(false), 1, 3, 2), 7},
        GradCase{"window_hybrid_KA", with_window(hybrid_config("KA", true), 2, 5, 3), 37},
        GradCase{
            "moe_hybrid_attnres",
            with_attnres(with_moe(hybrid_config("KA", false), 0, MoeBalanceMode::sign_bias), AttnResMode::block, 2),
            37}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Model, ParameterNamesAndSavedActivations) {
    Model model(small_config(false), mt::nn::Precision::cpu(DType::f32));
    const auto& t = model.params();
    EXPECT_GE(t.find("embed.weight"), 0);
    EXPECT_GE(t.find("layers.1.attn.wk.weight"), 0);
    EXPECT_GE(t.find("layers.0.mlp.w_down.weight"), 0);
    EXPECT_GE(t.find("lm_head.weight"), 0);
    EXPECT_EQ(t.spec(t.find("layers.1.attn.wk.weight")).shape, (mt::core::Shape{4, 12}));
    EXPECT_FALSE(t.spec(t.find("final_norm.weight")).weight_decay);
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);
    model.forward(ids, targets);
    EXPECT_GT(mt::nn::saved_bytes(model.saved_for_backward()), 0u);
}

TEST(Model, HybridParameterNamesAndGateInit) {
    ModelConfig cfg = hybrid_config("KA", false);
    cfg.n_layers = 4;  // the pattern repeats: K A K A
    Model model(cfg, mt::nn::Precision::cpu(DType::f32));
    auto& t = model.params();
    for (int l : {0, 2}) {
        const std::string p = "layers." + std::to_string(l);
        EXPECT_GE(t.find(p + ".kda.q_proj.weight"), 0);
        EXPECT_GE(t.find(p + ".kda_norm.weight"), 0);
        EXPECT_LT(t.find(p + ".attn_norm.weight"), 0);
        EXPECT_LT(t.find(p + ".attn.wq.weight"), 0);
    }
    for (int l : {1, 3}) {
        const std::string p = "layers." + std::to_string(l);
        EXPECT_GE(t.find(p + ".attn.wq.weight"), 0);
        EXPECT_GE(t.find(p + ".attn_norm.weight"), 0);
        EXPECT_LT(t.find(p + ".kda.q_proj.weight"), 0);
    }
    EXPECT_EQ(t.spec(t.find("layers.2.kda.dt_bias")).shape, (mt::core::Shape{8}));
    // ParamTable::initialize covers the gate parameters (kda.md §3): A_log = 0 for the bounded gate, dt_bias =
    // softplus^-1(delta) with delta in [1e-3, 1e-1], distinct per layer.
    t.initialize(5);
    const Tensor a0 = t.param(t.find("layers.0.kda.A_log")), b0 = t.param(t.find("layers.0.kda.dt_bias"));
    const Tensor b2 = t.param(t.find("layers.2.kda.dt_bias"));
    for (int64_t i = 0; i < a0.numel(); ++i) EXPECT_EQ(mt::core::tensor_get_flat(a0, i), 0.0);
    for (int64_t i = 0; i < b0.numel(); ++i) {
        const double delta = std::log1p(std::exp(mt::core::tensor_get_flat(b0, i)));
        EXPECT_GE(delta, 1e-3 * (1 - 1e-5));
        EXPECT_LE(delta, 1e-1 * (1 + 1e-5));
        EXPECT_NE(mt::core::tensor_get_flat(b0, i), mt::core::tensor_get_flat(b2, i));
    }
    EXPECT_FALSE(t.spec(t.find("layers.0.kda.A_log")).weight_decay);
    // The softplus gate draws A_log = log U(1, 16).
    cfg.kda.gate = mt::ops::KdaGateKind::softplus;
    Model soft(cfg, mt::nn::Precision::cpu(DType::f32));
    soft.params().initialize(5);
    const Tensor a = soft.params().param(soft.params().find("layers.0.kda.A_log"));
    for (int64_t i = 0; i < a.numel(); ++i) {
        EXPECT_GE(mt::core::tensor_get_flat(a, i), 0.0);
        EXPECT_LT(mt::core::tensor_get_flat(a, i), std::log(16.0) + 1e-6);
    }
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);
    model.forward(ids, targets);
    EXPECT_GT(mt::nn::saved_bytes(model.saved_for_backward()), 0u);
}

TEST(Model, FlopsCountKdaAndAttentionLayers) {
    const int64_t seq = 40;
    ModelConfig dense = small_config(true);
    ModelConfig hybrid = hybrid_config("KA", true);
    Model d(dense, mt::nn::Precision::cpu(DType::f32)), h(hybrid, mt::nn::Precision::cpu(DType::f32));
    auto matmul_params = [](const Model& m) {
        double n = 23.0 * 12.0;  // the tied LM head
        for (int i = 0; i < m.params().size(); ++i)
            if (m.params().spec(i).shape.size() == 2 && m.params().spec(i).name != "embed.weight")
                n += static_cast<double>(mt::core::shape_numel(m.params().spec(i).shape));
        return n;
    };
    // Dense: 6 N + 6 L T Hq D.
    EXPECT_DOUBLE_EQ(d.flops_per_token(seq), 6 * matmul_params(d) + 6.0 * 2 * seq * 3 * 4);
    // Hybrid: one attention layer, one KDA layer (HV 2, K 4, V 3, C = min(32, T)).
    const double kda = 6.0 * 2 * (3 * 4 * 3 + 32 * (1.5 * 4 + 3));
    EXPECT_DOUBLE_EQ(mt::nn::kda_flops_per_token(hybrid, seq), kda);
    EXPECT_DOUBLE_EQ(h.flops_per_token(seq), 6 * matmul_params(h) + 6.0 * 1 * seq * 3 * 4 + kda);
    // The KDA weights (projections and the [C, 4] conv filters) are in the matmul count.
    EXPECT_GT(matmul_params(h), matmul_params(d));
}

// An MoE model: layer 0 keeps a dense MLP of width moe.dense_ffn_dim, layer 1 is an MoE layer; the active routed
// experts count in the FLOPs (top_k * 3 * F * C per token and layer).
// A window layer's attention FLOPs count each query's min(t + 1, w) keys and the g global keys (summed here one
// query at a time), and its global tokens are not a per-token matmul.
TEST(Model, FlopsCountWindowLayers) {
    ModelConfig plain = small_config(false);
    const ModelConfig windowed = with_window(plain, 1, 3, 2);
    plain.attn.sink_logit = true;  // the same parameters but the global tokens
    const Model a(plain, mt::nn::Precision::cpu(DType::f32)), b(windowed, mt::nn::Precision::cpu(DType::f32));
    const int64_t t = 7, w = 3, g = 2;
    const double hd = static_cast<double>(plain.n_heads * plain.resolved_head_dim());
    double keys = 0;
    for (int64_t i = 0; i < t; ++i) keys += static_cast<double>(std::min(i + 1, w) + g);
    const double expected = a.flops_per_token(t) - 6.0 * t * hd + 12.0 * keys / t * hd;
    EXPECT_NEAR(b.flops_per_token(t), expected, 1e-9 * expected);
}

// Model::set_rope_theta (the curriculum's per-stage base) gives the loss and gradients of a model built with that
// base, and changes them.
TEST(Model, SetRopeThetaEqualsAModelBuiltWithIt) {
    ModelConfig c = small_config(false);
    auto run = [](Model& m) {
        m.params().initialize(4);
        m.params().zero_grads();
        const Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
        random_batch(ids, targets, 23);
        const double loss = m.forward(ids, targets);
        m.backward(1.0);
        return std::pair{loss, m.params().grad_arena().clone()};
    };
    Model base(c, mt::nn::Precision::cpu(DType::f64));
    const auto [loss_base, grads_base] = run(base);
    base.set_rope_theta(50.0);
    const auto [loss_set, grads_set] = run(base);
    c.rope_theta = 50.0;
    Model built(c, mt::nn::Precision::cpu(DType::f64));
    const auto [loss_built, grads_built] = run(built);
    EXPECT_EQ(loss_set, loss_built);
    EXPECT_EQ(std::memcmp(grads_set.raw(), grads_built.raw(), grads_set.nbytes()), 0);
    EXPECT_NE(loss_set, loss_base);
}

TEST(Model, MoeParameterNamesAndFlops) {
    const ModelConfig cfg = with_moe(small_config(true), 1, MoeBalanceMode::quantile);
    Model model(cfg, mt::nn::Precision::cpu(DType::f32));
    const auto& t = model.params();
    EXPECT_EQ(t.spec(t.find("layers.0.mlp.w_gate.weight")).shape, (mt::core::Shape{16, 12}));
    EXPECT_LT(t.find("layers.0.moe.router.weight"), 0);
    EXPECT_EQ(t.spec(t.find("layers.1.moe.router.weight")).shape, (mt::core::Shape{5, 12}));
    EXPECT_EQ(t.spec(t.find("layers.1.moe.experts.w_up")).shape, (mt::core::Shape{5, 6, 12}));
    EXPECT_EQ(t.spec(t.find("layers.1.moe.shared.w_down.weight")).shape, (mt::core::Shape{12, 6}));
    EXPECT_LT(t.find("layers.1.mlp.w_gate.weight"), 0);
    ASSERT_EQ(model.moe_layers().size(), 1u);
    EXPECT_EQ(model.moe_layers()[0].first, 1);
    double two_d = 23.0 * 12.0;  // the tied LM head
    for (int i = 0; i < t.size(); ++i)
        if (t.spec(i).shape.size() == 2 && t.spec(i).name != "embed.weight")
            two_d += static_cast<double>(mt::core::shape_numel(t.spec(i).shape));
    const double experts = 2.0 * 3 * 6 * 12;  // top_k * (gate, up, down) * F * C
    EXPECT_DOUBLE_EQ(model.flops_per_token(7), 6 * (two_d + experts) + 6.0 * 2 * 7 * 3 * 4);
}

// backward(s) scales every gradient by s, the aux loss's included (loss scaling and 1/grad_accum apply to it too);
// an evaluation forward (training = false) leaves the balancer's counts alone.
TEST(Model, MoeAuxGradientFollowsLossScaleAndEvalDoesNotCount) {
    Model model(with_moe(small_config(false), 0, MoeBalanceMode::aux_loss), mt::nn::Precision::cpu(DType::f64));
    model.params().initialize(3);
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);
    model.params().zero_grads();
    model.forward(ids, targets);
    EXPECT_GT(model.last_aux_loss(), 0.0);
    model.backward(1.0);
    const Tensor g1 = model.params().grad_arena().clone();
    model.params().zero_grads();
    model.forward(ids, targets);
    model.backward(0.25);
    const Tensor g2 = model.params().grad_arena();
    for (int64_t i = 0; i < g1.numel(); ++i)
        ASSERT_NEAR(mt::core::tensor_get_flat(g2, i), 0.25 * mt::core::tensor_get_flat(g1, i), 1e-15)
            << "gradient element " << i;

    Model qb(with_moe(small_config(false), 0, MoeBalanceMode::quantile), mt::nn::Precision::cpu(DType::f32));
    qb.params().initialize(3);
    auto counted = [&]() {
        uint64_t n = 0;
        for (auto& [layer, moe] : qb.moe_layers())
            for (uint64_t c : moe->balancer().histogram()) n += c;
        return n;
    };
    qb.forward(ids, targets);
    const uint64_t after_train = counted();
    EXPECT_EQ(after_train, 2u * 14 * 5);  // every (token, expert) pair of both layers
    qb.forward(ids, targets, /*training=*/false);
    EXPECT_EQ(counted(), after_train);
}

// The backward writes each weight gradient that it can (nn::Linear, the experts) the first time after zero_grads
// (ParamTable::first_grad_write) and adds after that: a second backward without zero_grads doubles every gradient
// (up to rounding), and the first equals a model that always adds (into the zeros of zero_grads) exactly (a written -0
// may stand where the sum gives +0: compared as values).
TEST(Model, FirstGradientWritesThenAdds) {
    const ModelConfig cfg = with_moe(hybrid_config("KA", false), 0, MoeBalanceMode::aux_loss);
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);
    auto gradients = [&](bool first_writes, int backwards) {
        Model model(cfg, mt::nn::Precision::cpu(DType::f64));
        model.params().initialize(3);
        model.params().set_first_grad_writes(first_writes);
        model.params().zero_grads();
        for (int b = 0; b < backwards; ++b) {
            model.forward(ids, targets);
            model.backward(1.0);
        }
        return model.params().grad_arena().clone();
    };
    const Tensor once = gradients(true, 1), twice = gradients(true, 2), added = gradients(false, 1);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < once.numel(); ++i) {
        const double g = mt::core::tensor_get_flat(once, i);
        nonzero += g != 0.0;
        ASSERT_EQ(g, mt::core::tensor_get_flat(added, i)) << "gradient element " << i;
        // 2g up to the rounding of a gradient summed from several contributions (g + c1 + c2 against 2 (c1 + c2))
        ASSERT_NEAR(mt::core::tensor_get_flat(twice, i), 2.0 * g, 1e-12 * std::max(1.0, std::fabs(g)))
            << "gradient element " << i;
    }
    EXPECT_GT(nonzero, once.numel() / 2);  // the comparison covered the gradients
}

// zero_grads(true), as the trainer's step calls it, leaves the gradients the backward writes whole (nn::Linear, the
// experts): a step whose arena starts as NaN (the last step's gradients, say) ends with the gradients of a fully
// zeroed one, so every gradient zero_grads left was written or settled.
TEST(Model, ZeroGradsLeavesOnlyWhatTheBackwardWrites) {
    for (const ModelConfig& cfg : {with_moe(hybrid_config("KA", true), 0, MoeBalanceMode::aux_loss),
                                   with_attnres(hybrid_config("AK", false), AttnResMode::block, 2)}) {
        Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
        random_batch(ids, targets, 23);
        auto gradients = [&](bool skip_written_whole) {
            Model model(cfg, mt::nn::Precision::cpu(DType::f64));
            model.params().initialize(3);
            model.params().grad_arena().fill(std::nan(""));
            model.params().zero_grads(skip_written_whole);
            model.forward(ids, targets);
            model.backward(1.0);
            return model.params().grad_arena().clone();
        };
        const Tensor left = gradients(true), zeroed = gradients(false);
        for (int64_t i = 0; i < left.numel(); ++i)
            ASSERT_EQ(mt::core::tensor_get_flat(left, i), mt::core::tensor_get_flat(zeroed, i)) << "element " << i;
    }
}

// What zero_grads(true) leaves and settle_grads zeroes: only parameters declared written whole, and only those not
// written since; a write-first parameter answers first_grad_write true once.
TEST(ParamTable, ZeroGradsSkipsTheWrittenWholeUntilSettled) {
    mt::nn::ParamTable t;
    const int a = t.add({.name = "a", .shape = {3, 70}}), b = t.add({.name = "b", .shape = {5}});
    const int c = t.add({.name = "c", .shape = {2, 64}});
    t.set_grad_written_whole(a);
    t.set_grad_written_whole(c);
    t.finalize(mt::nn::Precision::cpu(DType::f32));
    auto all_equal = [](const Tensor& g, double v) {
        for (int64_t i = 0; i < g.numel(); ++i)
            if (mt::core::tensor_get_flat(g, i) != v) return false;
        return true;
    };
    t.grad_arena().fill(7.0);
    t.zero_grads(/*skip_written_whole=*/true);
    EXPECT_TRUE(all_equal(t.grad(a), 7.0) && all_equal(t.grad(c), 7.0)) << "written-whole gradients are left";
    EXPECT_TRUE(all_equal(t.grad(b), 0.0));
    EXPECT_TRUE(t.first_grad_write(a));
    EXPECT_FALSE(t.first_grad_write(a));
    t.settle_grads();  // c was not written: zeroed; a was: kept
    EXPECT_TRUE(all_equal(t.grad(c), 0.0));
    EXPECT_TRUE(all_equal(t.grad(a), 7.0));
    EXPECT_TRUE(t.first_grad_write(c)) << "a settled gradient is still unwritten";
    t.grad_arena().fill(7.0);
    t.zero_grads();  // without the skip: everything
    EXPECT_TRUE(all_equal(t.grad_arena(), 0.0));
    t.set_first_grad_writes(false);  // CUDA graphs: always add, so zero_grads zeroes everything
    t.grad_arena().fill(7.0);
    t.zero_grads(true);
    EXPECT_TRUE(all_equal(t.grad_arena(), 0.0));
    EXPECT_FALSE(t.first_grad_write(a));
}

// With CUDA graphs on, the batches' document maps are copied into buffers that stay put (the replays read them
// there); on the CPU the steps run eagerly over those same buffers, so the losses and gradients of batches with
// different documents, and of a batch of another shape, equal those of a model that takes fresh maps.
TEST(Model, DocumentMapsInPlaceEqualFreshOnes) {
    ModelConfig cfg = small_config(false);
    cfg.document_mask = true;
    cfg.eot_token = 5;
    Model fresh(cfg, mt::nn::Precision::cpu(DType::f64)), kept(cfg, mt::nn::Precision::cpu(DType::f64));
    fresh.params().initialize(3);
    kept.params().initialize(3);
    kept.set_cuda_graphs(true);  // no graphs on the CPU: the in-place maps alone
    for (int batch = 0; batch < 4; ++batch) {
        const int64_t seq = batch < 3 ? 9 : 12;
        Tensor ids = Tensor::zeros({2, seq}, DType::i32), targets = Tensor::zeros({2, seq}, DType::i32);
        for (int64_t i = 0; i < ids.numel(); ++i) {  // an EOT at a batch-dependent place or two in each row
            const bool eot = (i * 3 + batch * 5) % 7 == 0;
            mt::core::tensor_set_flat(ids, i, eot ? 5.0 : static_cast<double>(mt::core::rng_u64(9, batch, i) % 23));
            mt::core::tensor_set_flat(targets, i, static_cast<double>(mt::core::rng_u64(9, 7 + batch, i) % 23));
        }
        for (Model* m : {&fresh, &kept}) m->params().zero_grads();
        const double a = fresh.forward(ids, targets), b = kept.forward(ids, targets);
        fresh.backward(1.0);
        kept.backward(1.0);
        ASSERT_EQ(a, b) << "batch " << batch;
        const Tensor ga = fresh.params().grad_arena(), gb = kept.params().grad_arena();
        for (int64_t i = 0; i < ga.numel(); ++i)
            ASSERT_EQ(mt::core::tensor_get_flat(ga, i), mt::core::tensor_get_flat(gb, i)) << "batch " << batch;
    }
}
