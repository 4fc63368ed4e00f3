// Image + text through the whole model (multimodal.md §3 and §9 test 1): the projector's outputs replace the
// embeddings of the <img_pad> slots (early fusion: the hybrid's KDA, attention, MoE and AttnRes layers see them as
// tokens), the loss's gradient reaches the ViT and the projector through the splice (fp64 central differences), the
// placeholder's embedding row gets no gradient from the slots, a text-only batch runs on a vision model, a batch
// whose image tokens do not match its images is refused, and the forward waits for the tower's parameters (ZeRO-1)
// before it reads them.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "support/finite_differences.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

constexpr int32_t kImage = 3, kStart = 2, kEnd = 4, kEot = 1;

ModelConfig tiny_multimodal() {
    ModelConfig c;
    c.vocab_size = 23;
    c.d_model = 16;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 64;
    c.init_std = 0.2;
    c.tie_embeddings = false;  // so that the embedding's gradient is the lookups' alone (the tied head's is dense)
    c.layer_pattern = "KKKA";
    c.kda.num_heads = 2;
    c.kda.head_dim = 4;
    c.moe_enabled = true;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 8;
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 4;
    c.document_mask = true;
    c.eot_token = kEot;
    c.vision.patch = 2;  // 12 values per patch
    c.vision.dim = 8;
    c.vision.layers = 1;
    c.vision.heads = 2;  // head dim 4
    c.vision.mlp = 12;
    c.vision.init_std = 0.3;
    c.vision.image_token = kImage;
    return c;
}

// Row 0: <bos> <img_start> [2 slots] <img_end> text <eos>, then a second sample with a 4-slot image; row 1: text
// with one 2-slot image in the middle. Images in row-major order of their blocks: 2x4 (2 slots), 4x4 (4), 4x2 (2).
struct Batch {
    Tensor ids, targets;
    VisionBatch images;
};

Batch make_batch(const ModelConfig& cfg, DType dtype) {
    const std::vector<std::vector<int32_t>> rows = {
        {0, kStart, kImage, kImage, kEnd, 7, 9, 11, kEot, 0, kStart, kImage, kImage, kImage, kImage, kEnd, 8, 10, kEot},
        {0, 12, 13, 14, kStart, kImage, kImage, kEnd, 15, 16, 17, 18, 19, 20, 21, 22, 5, 6, kEot}};
    const int64_t t = static_cast<int64_t>(rows[0].size());
    Batch b{Tensor::zeros({2, t}, DType::i32), Tensor::zeros({2, t}, DType::i32), {}};
    for (int64_t r = 0; r < 2; ++r)
        for (int64_t i = 0; i < t; ++i) {
            const auto& row = rows[static_cast<size_t>(r)];
            b.ids.data<int32_t>()[r * t + i] = row[static_cast<size_t>(i)];
            // Supervised: text targets whose input is not an image slot or <img_start> (multimodal.md §3).
            const int32_t next = i + 1 < t ? row[static_cast<size_t>(i + 1)] : -1;
            const bool text = next >= 0 && next != kImage && next != kStart && next != kEnd;
            const bool slot_input = row[static_cast<size_t>(i)] == kImage || row[static_cast<size_t>(i)] == kStart;
            b.targets.data<int32_t>()[r * t + i] = text && !slot_input ? next : kIgnoreIndex;
        }
    b.images.grids = {{2, 4}, {4, 4}, {4, 2}};
    b.images.patches = Tensor::zeros({b.images.num_patches(), cfg.vision.patch_values()}, dtype);
    core::rng_fill_normal(b.images.patches, 3, 1, 0.0, 1.0);
    return b;
}

int param_index(const ParamTable& table, const std::string& name) {
    const int i = table.find(name);
    EXPECT_GE(i, 0) << "no parameter " << name;
    return std::max(i, 0);
}

TEST(ModelVision, GradientsThroughTheSpliceMatchFiniteDifferences) {
    const ModelConfig cfg = tiny_multimodal();
    Model model(cfg, Precision::cpu(DType::f64));
    model.params().initialize(5);
    const Batch b = make_batch(cfg, DType::f64);
    model.set_vision_batch(b.images);
    auto loss = [&] { return model.forward(b.ids, b.targets); };
    model.params().zero_grads();
    loss();
    model.backward(1.0);
    ParamTable& table = model.params();
    int checked = 0;
    for (const char* name : {"vision.patch_embed.weight",
                             "vision.blocks.0.attn.q.weight",
                             "vision.blocks.0.mlp.fc2.bias",
                             "projector.fc1.weight",
                             "projector.fc2.bias",
                             "layers.0.kda.q_proj.weight"}) {
        SCOPED_TRACE(name);
        Tensor p = table.param(param_index(table, name));
        const Tensor g = table.grad(param_index(table, name));
        checked += testing::expect_central_differences(loss, {{&p, &g}}, [](int64_t n) {
            return std::vector<int64_t>{1, n / 2, n - 2};
        });
    }
    EXPECT_EQ(checked, 18);
    // The <img_pad> row of the embedding: its lookups were all replaced, so no gradient reaches it.
    const Tensor embed_grad = table.grad(param_index(table, "embed.weight"));
    for (int64_t c = 0; c < cfg.d_model; ++c)
        EXPECT_EQ(core::tensor_get_flat(embed_grad, kImage * cfg.d_model + c), 0.0);
    bool other_rows_learn = false;
    for (int64_t c = 0; c < cfg.d_model; ++c)
        other_rows_learn = other_rows_learn || core::tensor_get_flat(embed_grad, kStart * cfg.d_model + c) != 0.0;
    EXPECT_TRUE(other_rows_learn) << "<img_start>'s embedding is looked up and must get a gradient";
}

// The images change the loss (the pixels reach it), and a text-only batch runs on the same model.
TEST(ModelVision, PixelsReachTheLossAndTextOnlyBatchesRun) {
    const ModelConfig cfg = tiny_multimodal();
    Model model(cfg, Precision::cpu(DType::f32));
    model.params().initialize(5);
    Batch b = make_batch(cfg, DType::f32);
    model.set_vision_batch(b.images);
    const double base = model.forward(b.ids, b.targets);
    b.images.patches = b.images.patches.clone();
    core::rng_fill_normal(b.images.patches, 4, 1, 0.0, 1.0);
    model.set_vision_batch(b.images);
    EXPECT_NE(model.forward(b.ids, b.targets), base);
    Tensor text = b.ids.clone();
    for (int64_t i = 0; i < text.numel(); ++i)
        if (text.data<int32_t>()[i] == kImage) text.data<int32_t>()[i] = 12;
    model.set_vision_batch({});
    EXPECT_GT(model.forward(text, b.targets), 0.0);
    model.backward(1.0);
}

TEST(ModelVision, RefusesImageTokensThatDoNotMatchTheImages) {
    const ModelConfig cfg = tiny_multimodal();
    Model model(cfg, Precision::cpu(DType::f32));
    model.params().initialize(5);
    Batch b = make_batch(cfg, DType::f32);
    b.images.grids.pop_back();  // 6 tokens of images for 8 slots
    b.images.patches = b.images.patches.slice(0, 0, b.images.num_patches()).clone();
    model.set_vision_batch(b.images);
    EXPECT_THROW(model.forward(b.ids, b.targets), core::Error);
    model.set_vision_batch({});  // no images at all for 8 slots
    EXPECT_THROW(model.forward(b.ids, b.targets), core::Error);
}

// ZeRO-1's parameter gathers are waited for as the forward reaches each parameter (Model::set_params_needed_hook). The
// tower's parameters follow the embedding's in the table and are read right after the lookup: the first wait, before
// the embedding, covers them (on a GPU a read before it races the gather; the CPU's gathers land early anyway).
TEST(ModelVision, ForwardWaitsForTheTowersParametersWithTheEmbedding) {
    ModelConfig cfg = tiny_multimodal();
    cfg.attnres.mode = AttnResMode::off;  // under Block AttnRes the forward waits for every parameter up front
    Model model(cfg, Precision::cpu(DType::f32));
    model.params().initialize(5);
    const Batch b = make_batch(cfg, DType::f32);
    int tower_end = 0;
    for (int i = 0; i < model.params().size(); ++i) {
        const std::string& name = model.params().spec(i).name;
        if (name.starts_with("vision.") || name.starts_with("projector.")) tower_end = i + 1;
    }
    EXPECT_GT(tower_end, 1);
    std::vector<int> ends;
    model.set_params_needed_hook([&](int end) { ends.push_back(end); });
    model.set_vision_batch(b.images);
    model.forward(b.ids, b.targets);
    ASSERT_FALSE(ends.empty());
    EXPECT_GE(ends.front(), tower_end);
}

}  // namespace
}  // namespace mt::nn
