// Block AttnRes over pipeline chunks (attnres.md §7): which sources each hop between stages carries, with and
// without the cache, and a model cut into chunks, run chunk by chunk through one carry, equals the whole model
// (loss and every gradient) for block sizes whose blocks do and do not end at the chunk boundaries. The stages
// under mpirun are tests/parallel/mpi/trainer_pp_test.cpp's.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"

using mt::core::DType;
using mt::core::Tensor;
using mt::nn::attnres_hop_sources;
using mt::nn::AttnResCarry;
using mt::nn::AttnResMode;
using mt::nn::Model;
using mt::nn::ModelConfig;
using mt::nn::ModelPart;

namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

ModelConfig config(int64_t block_size) {
    ModelConfig c;
    c.vocab_size = 19;
    c.d_model = 8;
    c.n_layers = 4;  // L = 8 sub-layers
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.d_ff = 12;
    c.max_seq_len = 16;
    c.tie_embeddings = false;
    c.init_std = 0.3;
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = block_size;
    return c;
}

// Per-name draws, with the pseudo-queries away from their zero init so that every mix weighs its sources unevenly.
void initialize(Model& model) {
    model.params().initialize(5);
    for (int i = 0; i < model.params().size(); ++i) {
        const std::string& name = model.params().spec(i).name;
        if (name.ends_with(".query"))
            mt::core::rng_fill_normal(model.params().param(i), 17, std::hash<std::string>{}(name), 0.0, 0.5);
    }
}

struct Batch {
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    explicit Batch(int64_t vocab) {
        for (int64_t i = 0; i < ids.numel(); ++i) {
            mt::core::tensor_set_flat(ids, i, static_cast<double>(mt::core::rng_u64(3, 1, i) % vocab));
            mt::core::tensor_set_flat(targets, i, static_cast<double>(mt::core::rng_u64(3, 2, i) % vocab));
        }
    }
};

}  // namespace

// 4 chunks of 2 layers (sub-layers [0, 4), [4, 8), [8, 12), [12, 16)) on 2 stages, blocks of 3 sub-layers: the
// blocks end at sub-layers 2, 5, 8, 11 and 14, so every boundary but the last cuts a block.
TEST(AttnResPipeline, HopSourcesOfAnExample) {
    const Ranges chunks = {{0, 4}, {4, 8}, {8, 12}, {12, 16}};
    using V = std::vector<int64_t>;
    // Without the cache, every source of the chunk's first mix: the embedding, the completed blocks, the cut one's
    // running partial sum.
    EXPECT_EQ(attnres_hop_sources(chunks, 1, 2, false, 3), (V{-1, 2, 3}));
    EXPECT_EQ(attnres_hop_sources(chunks, 2, 2, false, 3), (V{-1, 2, 5, 7}));
    EXPECT_EQ(attnres_hop_sources(chunks, 3, 2, false, 3), (V{-1, 2, 5, 8, 11}));
    // With it, chunk 2's stage kept the embedding and block 2 from chunk 0, chunk 3's also block 5 from chunk 1.
    EXPECT_EQ(attnres_hop_sources(chunks, 1, 2, true, 3), (V{-1, 2, 3}));  // the first hop into a stage: all
    EXPECT_EQ(attnres_hop_sources(chunks, 2, 2, true, 3), (V{5, 7}));
    EXPECT_EQ(attnres_hop_sources(chunks, 3, 2, true, 3), (V{8, 11}));
    // A running partial sum is never kept: it is sent by the chunk that cut the block, whatever the cache.
    EXPECT_EQ(attnres_hop_sources({{0, 2}, {2, 4}, {4, 6}}, 2, 1, true, 6), (V{3}));
    EXPECT_THROW(attnres_hop_sources(chunks, 0, 2, true, 3), mt::core::Error);
}

// The model cut into chunks on one rank, each chunk's forward in model order and backward in reverse through one
// carry, equals the whole model in f64 (rho <= 1e-12 on the loss and every gradient).
TEST(AttnResPipeline, ChunksThroughACarryEqualTheWholeModel) {
    for (const int64_t block : {1, 3, 4}) {
        for (const Ranges& chunks : {Ranges{{0, 1}, {1, 4}}, Ranges{{0, 2}, {2, 3}, {3, 4}}}) {
            const ModelConfig cfg = config(block);
            const Batch batch(cfg.vocab_size);
            const auto precision = mt::nn::Precision::cpu(DType::f64);
            Model whole(cfg, precision);
            initialize(whole);
            whole.params().zero_grads();
            const double loss = whole.forward(batch.ids, batch.targets);
            whole.backward(1.0);

            Model cut(cfg, precision, 64, {}, {}, ModelPart{chunks});
            initialize(cut);
            cut.params().zero_grads();
            AttnResCarry carry;
            cut.set_attnres_carry(&carry);
            double cut_loss = 0.0;
            for (int c = 0; c < cut.num_chunks(); ++c)
                cut_loss += cut.forward_chunk(c, batch.ids, batch.targets, Tensor(), true, false);
            // Chunk 0 left the embedding, its completed blocks and its last partial sum for the later chunks.
            EXPECT_TRUE(carry.values.count(-1));
            for (int c = cut.num_chunks() - 1; c >= 0; --c) {
                // The backward of a chunk needs its own forward's activations: re-run it (as a pipeline stage would).
                if (c < cut.num_chunks() - 1) cut.forward_chunk(c, batch.ids, batch.targets, Tensor(), true, true);
                cut.backward_chunk(1.0, Tensor());
            }
            const std::string what =
                "block " + std::to_string(block) + ", " + std::to_string(chunks.size()) + " chunks";
            EXPECT_NEAR(cut_loss, loss, 1e-12 * std::abs(loss)) << what;
            // Every gradient the carry took for an upstream source went to the chunk that computed it.
            EXPECT_TRUE(carry.grads.empty()) << what;
            ASSERT_EQ(cut.params().size(), whole.params().size()) << what;
            for (int i = 0; i < cut.params().size(); ++i) {
                const std::string& name = cut.params().spec(i).name;
                const int j = whole.params().find(name);
                ASSERT_GE(j, 0) << what << ": " << name;
                EXPECT_LE(mt::testing::rho(cut.params().grad(i), whole.params().grad(j)), 1e-12)
                    << what << ": " << name;
            }
        }
    }
}
