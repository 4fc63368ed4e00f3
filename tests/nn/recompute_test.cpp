// Activation recompute (nn/recompute.h): every policy gives the loss, the gradients and the MoE routing state of
// policy none, bit for bit on the CPU in f32 (the backward re-runs the same kernels on the same inputs), for dense,
// hybrid, MoE and AttnRes models, over two micro-batches; and it does hold fewer saved bytes after the forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/backend.h"
#include "core/rng.h"
#include "nn/model.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

ModelConfig base(const std::string& pattern) {
    ModelConfig c;
    c.vocab_size = 29;
    c.d_model = 16;
    c.n_layers = 5;  // sqrt(5) rounds to 2: groups of 2, 2, 1
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 48;
    c.init_std = 0.2;
    c.tie_embeddings = false;
    c.layer_pattern = pattern;
    c.kda.num_heads = 2;
    c.kda.num_v_heads = 4;
    c.kda.head_dim = 4;
    c.kda.head_v_dim = 4;
    c.kda.chunk_size = 32;
    return c;
}

ModelConfig with_moe(ModelConfig c) {
    c.moe_enabled = true;
    c.moe_first_k_dense = 1;
    c.moe.num_experts = 6;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 8;
    return c;
}

ModelConfig with_attnres(ModelConfig c) {
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 4;
    return c;
}

struct Outcome {
    double loss[2];
    Tensor grads;
    std::vector<Tensor> moe_state;  // every MoE layer's balancer tensors after the step (bias, loads, histogram)
    std::vector<int64_t> loads;     // the step's per-expert loads, every MoE layer
    size_t saved_after_forward;
};

// Two micro-batches (forward + backward each, gradients accumulating), then the MoE step end.
Outcome train_step(ModelConfig cfg, const RecomputeConfig& recompute, const Precision& precision) {
    cfg.recompute = recompute;
    Model model(cfg, precision);
    model.params().initialize(7);
    model.params().zero_grads();
    Outcome out{};
    for (int micro = 0; micro < 2; ++micro) {
        const int64_t t = std::min<int64_t>(cfg.max_seq_len, 40), v = cfg.vocab_size;
        Tensor ids = Tensor::zeros({2, t}, DType::i32), targets = Tensor::zeros({2, t}, DType::i32);
        for (int64_t i = 0; i < ids.numel(); ++i) {
            core::tensor_set_flat(ids, i, static_cast<double>(core::rng_u64(11, micro, i) % v));
            core::tensor_set_flat(targets, i, static_cast<double>(core::rng_u64(12, micro, i) % v));
        }
        out.loss[micro] = model.forward(ids, targets);
        if (micro == 0) out.saved_after_forward = model.saved_activation_bytes();
        model.backward(0.5);
    }
    for (auto& [l, metrics] : model.moe_step_end(0))
        out.loads.insert(out.loads.end(), metrics.load.begin(), metrics.load.end());
    for (auto& [l, moe] : model.moe_layers())
        for (auto& [name, t] : moe->state_tensors()) out.moe_state.push_back(t.to_device(core::Device::cpu));
    out.grads = model.params().grad_arena().to_device(core::Device::cpu);
    return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

RecomputeConfig selective(std::vector<RecomputeModule> modules) {
    return {.policy = RecomputePolicy::selective, .modules = std::move(modules)};
}

RecomputeConfig full(int64_t every) {
    return {.policy = RecomputePolicy::full, .every = every};
}

using M = RecomputeModule;
const std::vector<std::pair<std::string, RecomputeConfig>>& policies() {
    static const std::vector<std::pair<std::string, RecomputeConfig>> all = {
        {"attn_core", selective({M::attn_core})},
        {"kda", selective({M::kda})},
        {"mlp_act", selective({M::mlp_act})},
        {"moe_act", selective({M::moe_act})},
        {"norm", selective({M::norm})},
        {"attnres", selective({M::attnres})},
        {"moe_permute", selective({M::moe_permute})},
        {"moe_experts", selective({M::moe_experts})},
        {"moe_experts, moe_permute", selective({M::moe_experts, M::moe_permute})},
        {"all modules",
         selective(
             {M::attn_core, M::kda, M::mlp_act, M::moe_act, M::norm, M::attnres, M::moe_permute, M::moe_experts})},
        {"full every 1", full(1)},
        {"full every 2", full(2)},
        {"full every sqrt", full(0)},
    };
    return all;
}

struct Case {
    const char* name;
    ModelConfig cfg;
};

class RecomputeEquality : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeEquality, EveryPolicyGivesTheGradientsOfNoneBitForBit) {
    const ModelConfig& cfg = GetParam().cfg;
    const Outcome none = train_step(cfg, {}, Precision::cpu(DType::f32));
    EXPECT_EQ(none.loads.empty(), !cfg.moe_enabled);  // the MoE models counted routing to compare
    for (const auto& [name, policy] : policies()) {
        SCOPED_TRACE(name);
        const Outcome r = train_step(cfg, policy, Precision::cpu(DType::f32));
        EXPECT_LE(r.saved_after_forward, none.saved_after_forward);
        if (name == "all modules" || name.starts_with("full") || (cfg.moe_enabled && name.starts_with("moe_"))) {
            EXPECT_LT(r.saved_after_forward, none.saved_after_forward);
        }
        EXPECT_EQ(r.loss[0], none.loss[0]);
        EXPECT_EQ(r.loss[1], none.loss[1]);
        EXPECT_TRUE(same_bytes(r.grads, none.grads));
        EXPECT_EQ(r.loads, none.loads);  // the recomputed forwards did not count the routing again
        ASSERT_EQ(r.moe_state.size(), none.moe_state.size());
        for (size_t i = 0; i < r.moe_state.size(); ++i) EXPECT_TRUE(same_bytes(r.moe_state[i], none.moe_state[i])) << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Models,
                         RecomputeEquality,
                         ::testing::Values(Case{"dense", base("A")},
                                           Case{"hybrid", base("KAKKA")},
                                           Case{"moe", with_moe(base("A"))},
                                           Case{"hybrid_moe_attnres", with_attnres(with_moe(base("KAKKA")))},
                                           Case{"attnres", with_attnres(base("A"))}),
                         [](const auto& info) { return std::string(info.param.name); });

// On the GPU in bf16, a hybrid MoE model with Block AttnRes at kernel-sized widths: every policy's loss and gradients
// within bf16 rounding of none's (the recompute re-runs the same deterministic kernels, so they are expected to be
// equal; the test says when they are not bitwise), and the routing counted once.
TEST(GpuRecompute, EveryPolicyMatchesNoneWithinBf16) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device";
    ModelConfig cfg = with_attnres(with_moe(base("KAKKA")));
    cfg.vocab_size = 257, cfg.d_model = 256, cfg.n_heads = 4, cfg.n_kv_heads = 2, cfg.d_ff = 512;
    cfg.max_seq_len = 128, cfg.init_std = 0.02;
    cfg.kda.num_heads = 2, cfg.kda.num_v_heads = 2, cfg.kda.head_dim = 64, cfg.kda.head_v_dim = 64;
    cfg.kda.chunk_size = 64;
    cfg.moe.num_experts = 8, cfg.moe.expert_ffn_dim = 128;
    const Precision bf16 = Precision::cuda_bf16();
    const Outcome none = train_step(cfg, {}, bf16);
    ModelConfig plain = cfg;  // full with every > 1 needs the plain residual
    plain.attnres.mode = AttnResMode::off;
    const Outcome plain_none = train_step(plain, {}, bf16);
    for (const auto& [name, policy] : policies()) {
        SCOPED_TRACE(name);
        const bool grouped = policy.full() && policy.every != 1;
        const Outcome& ref = grouped ? plain_none : none;
        const Outcome r = train_step(grouped ? plain : cfg, policy, bf16);
        EXPECT_NEAR(r.loss[0], ref.loss[0], 1e-3 * std::abs(ref.loss[0]));
        EXPECT_NEAR(r.loss[1], ref.loss[1], 1e-3 * std::abs(ref.loss[1]));
        EXPECT_EQ(r.loads, ref.loads);
        const Tensor a = r.grads.to(DType::f32), b = ref.grads.to(DType::f32);
        double worst = 0.0, scale = 0.0;
        for (int64_t i = 0; i < a.numel(); ++i) {
            worst = std::max(worst, static_cast<double>(std::abs(a.data<float>()[i] - b.data<float>()[i])));
            scale = std::max(scale, static_cast<double>(std::abs(b.data<float>()[i])));
        }
        EXPECT_GT(scale, 0.0);
        EXPECT_LE(worst, 1e-2 * scale) << "largest gradient difference " << worst << " of " << scale;
        if (!same_bytes(r.grads, ref.grads))
            std::printf("%s: gradients within %.3g of %.3g, not bitwise\n", name.c_str(), worst, scale);
    }
}

}  // namespace
}  // namespace mt::nn
