// The shipped job configs that are too large to train in a test: each parses with every cross-key check and
// describes the model its header comment states. The shrunk training of configs/kimi_linear_mini.toml on the CPU is
// tests/scripts/kimi_linear_mini.sh.
#include <gtest/gtest.h>

#include <string>

#include "train/config.h"

TEST(ShippedConfigs, KimiLinearMiniParsesAsDescribed) {
    const auto cfg = mt::train::config_load(std::string(MT_SOURCE_DIR) + "/configs/kimi_linear_mini.toml");
    const auto& m = cfg.model;
    EXPECT_EQ(m.n_layers, 16);
    EXPECT_EQ(m.d_model, 1536);
    EXPECT_EQ(m.vocab_size, 32768);
    EXPECT_EQ(m.layer_pattern, "KKKA");
    EXPECT_EQ(m.n_kda_layers(), 12);
    EXPECT_TRUE(m.layer_is_kda(0));
    EXPECT_FALSE(m.layer_is_kda(15)) << "the last layer is global attention, as in Kimi Linear";
    EXPECT_FALSE(m.tie_embeddings);
    // KDA: 12 heads of K = V = 128 with the lower-bounded gate.
    EXPECT_EQ(m.kda_num_heads(), 12);
    EXPECT_EQ(m.kda_num_v_heads(), 12);
    EXPECT_EQ(m.kda_head_dim(), 128);
    EXPECT_EQ(m.kda_head_v_dim(), 128);
    EXPECT_EQ(m.kda.gate, mt::ops::KdaGateKind::lower_bound);
    // GQA attention, 12 query heads over 4 kv heads of 128, no position encoding.
    EXPECT_EQ(m.n_heads, 12);
    EXPECT_EQ(m.n_kv_heads, 4);
    EXPECT_EQ(m.resolved_head_dim(), 128);
    EXPECT_FALSE(m.attn_rope());
    // MoE in layers 1-15: 64 experts of 512, top 8, one shared; the dense layer as wide as 8 + 1 experts.
    EXPECT_TRUE(m.moe_enabled);
    EXPECT_FALSE(m.layer_is_moe(0));
    EXPECT_EQ(m.n_moe_layers(), 15);
    EXPECT_EQ(m.moe.num_experts, 64);
    EXPECT_EQ(m.moe.top_k, 8);
    EXPECT_EQ(m.moe.num_shared_experts, 1);
    EXPECT_EQ(m.moe.expert_ffn_dim, 512);
    EXPECT_EQ(m.dense_ffn_dim(), (m.moe.top_k + m.moe.num_shared_experts) * m.moe.expert_ffn_dim);
    EXPECT_EQ(m.moe.balance.mode, mt::nn::MoeBalanceMode::quantile);
    // Block AttnRes over blocks of 8 sub-layers: 4 blocks and the embedding.
    EXPECT_EQ(m.attnres.mode, mt::nn::AttnResMode::block);
    EXPECT_EQ(m.attnres.block_size, 8);
    EXPECT_EQ(m.attnres.max_sources(m.n_layers), 5);
    EXPECT_EQ(cfg.train.seq_len, 4096);
    EXPECT_EQ(cfg.train.batch_size, 4);
    EXPECT_EQ(cfg.run.precision, "auto") << "bf16 mixed precision on the GPU";
}
