// The vision tower (nn/vision/vision_encoder.h, multimodal.md §1-§2 and §9 tests 1-2), with each vision.pos (2-D
// RoPE, and the learned table resized to each grid): fp64 central differences through the patch embedding (and the
// position table), both ViT blocks (bidirectional packed attention, GELU MLP), the final norm and the projector;
// packed images independent bit for bit (perturbing image B leaves image A's outputs unchanged); an image alone
// equals the same image packed with others; the whole tower against the PyTorch reference of
// tools/reference/vision.py (f32, rho <= 1e-5 on the output and every parameter gradient; Debian's python3-torch or
// MT_REFERENCE_PYTHON); bad batches and configs refused with the field named.
#include "nn/vision/vision_encoder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/rng.h"
#include "support/finite_differences.h"
#include "support/rho.h"
#include "support/tiny_job.h"
#include "train/safetensors.h"

namespace mt::nn {
namespace {

using core::DType;

VisionConfig tiny_config() {
    VisionConfig cfg;
    cfg.patch = 2;  // 12 values per patch: small enough for finite differences
    cfg.dim = 16;
    cfg.layers = 2;
    cfg.heads = 2;  // head dim 8
    cfg.mlp = 24;
    cfg.init_std = 0.3;  // O(1) activations, so every path carries gradient
    return cfg;
}

// The tiny tower with learned positions from a 3 x 3 table: the test grids (2 and 4 patches a side) resize it up.
VisionConfig learned(VisionConfig cfg, int64_t grid = 3) {
    cfg.pos = "learned";
    cfg.pos_grid = grid;
    return cfg;
}

constexpr int64_t kDModel = 12;

// Random patches for the given grids (f64 or f32 host tensor).
VisionBatch make_batch(const std::vector<ImageGrid>& grids, const VisionConfig& cfg, DType dtype, uint64_t stream) {
    VisionBatch b;
    b.grids = grids;
    b.patches = Tensor::zeros({b.num_patches(), cfg.patch_values()}, dtype);
    core::rng_fill_normal(b.patches, 5, stream, 0.0, 1.0);
    return b;
}

struct Tower {
    ParamTable table;
    VisionEncoder enc;

    Tower(const VisionConfig& cfg, DType dtype) : enc(table, cfg, kDModel) {
        table.finalize(Precision::cpu(dtype));
        table.initialize(11);
        // Generic gains and biases (they start at 1 and 0).
        for (int i = 0; i < table.size(); ++i) {
            const std::string& name = table.spec(i).name;
            const uint64_t stream = core::hash_name(name.c_str());
            if (name.find("norm") != std::string::npos && name.ends_with(".weight"))
                core::rng_fill_uniform(table.master(i), 11, stream, 0.5, 1.5);
            if (name.ends_with(".bias")) core::rng_fill_uniform(table.master(i), 11, stream, -0.3, 0.3);
        }
        table.refresh_params_from_master();
    }
    int index(const std::string& name) const {
        const int i = table.find(name);
        EXPECT_GE(i, 0) << "no parameter " << name;
        return std::max(i, 0);
    }
};

void check_finite_differences(const VisionConfig& cfg) {
    Tower t(cfg, DType::f64);
    const VisionBatch batch = make_batch({{2, 4}, {4, 2}, {2, 2}}, cfg, DType::f64, 1);
    ASSERT_EQ(batch.num_tokens(), 5);
    Tensor r = Tensor::zeros({batch.num_tokens(), kDModel}, DType::f64);
    core::rng_fill_normal(r, 7, 1, 0.0, 1.0);
    auto loss = [&] {
        const Tensor& out = t.enc.forward(batch);
        double s = 0.0;
        for (int64_t i = 0; i < out.numel(); ++i) s += core::tensor_get_flat(out, i) * core::tensor_get_flat(r, i);
        return s;
    };
    t.table.zero_grads();
    loss();
    t.enc.backward(r);
    const char* names[] = {"vision.patch_embed.weight",
                           "vision.patch_embed.bias",
                           "vision.blocks.0.norm1.weight",
                           "vision.blocks.0.attn.q.weight",
                           "vision.blocks.0.attn.k.bias",
                           "vision.blocks.0.attn.v.weight",
                           "vision.blocks.1.attn.o.weight",
                           "vision.blocks.1.norm2.bias",
                           "vision.blocks.1.mlp.fc1.weight",
                           "vision.blocks.1.mlp.fc2.bias",
                           "vision.final_norm.weight",
                           "projector.norm.bias",
                           "projector.fc1.weight",
                           "projector.fc2.weight",
                           "vision.pos_embed.weight"};
    int checked = 0;
    for (const char* name : names) {
        if (cfg.rope2d() && std::string_view(name) == "vision.pos_embed.weight") continue;
        SCOPED_TRACE(name);
        Tensor p = t.table.param(t.index(name));
        const Tensor g = t.table.grad(t.index(name));
        checked += testing::expect_central_differences(loss, {{&p, &g}}, [](int64_t n) {
            return std::vector<int64_t>{0, n / 3, n - 1};
        });
    }
    EXPECT_EQ(checked, cfg.rope2d() ? 42 : 45);
}

TEST(VisionEncoder, GradientsMatchFiniteDifferences) {
    check_finite_differences(tiny_config());
}

// The table resized up (3 -> 4) and down (5 -> 4, 2): its gradient gathers from every output it feeds.
TEST(VisionEncoder, LearnedPositionGradientsMatchFiniteDifferences) {
    check_finite_differences(learned(tiny_config()));
    check_finite_differences(learned(tiny_config(), 5));
}

// Image B perturbed: image A's slot embeddings are bit for bit the same, and image A alone gives them too (to
// rounding: a different packing changes the GEMM shapes).
void check_packed_images_independent(const VisionConfig& cfg) {
    Tower t(cfg, DType::f64);
    const VisionBatch both = make_batch({{2, 4}, {4, 4}}, cfg, DType::f64, 2);
    const Tensor base = t.enc.forward(both).clone();
    VisionBatch moved = both;
    moved.patches = both.patches.clone();
    const Tensor b_patches = moved.patches.slice(0, 8, 24);
    core::rng_fill_normal(b_patches, 9, 9, 0.0, 1.0);
    const Tensor other = t.enc.forward(moved).clone();
    const Tensor a0 = base.slice(0, 0, 2).clone(), a1 = other.slice(0, 0, 2).clone();
    EXPECT_EQ(std::memcmp(a0.raw(), a1.raw(), a0.nbytes()), 0);
    EXPECT_NE(std::memcmp(base.slice(0, 2, 6).clone().raw(), other.slice(0, 2, 6).clone().raw(), 4 * kDModel * 8), 0);
    VisionBatch alone;
    alone.grids = {{2, 4}};
    alone.patches = both.patches.slice(0, 0, 8).clone();
    const Tensor solo = t.enc.forward(alone).clone();
    for (int64_t i = 0; i < solo.numel(); ++i)
        EXPECT_NEAR(core::tensor_get_flat(solo, i), core::tensor_get_flat(a0, i), 1e-12) << i;
}

TEST(VisionEncoder, PackedImagesAreIndependent) {
    check_packed_images_independent(tiny_config());
}

TEST(VisionEncoder, PackedImagesAreIndependentWithLearnedPositions) {
    check_packed_images_independent(learned(tiny_config()));
}

double l2(const Tensor& t) {
    double sq = 0.0;
    for (int64_t i = 0; i < t.numel(); ++i) sq += core::tensor_get_flat(t, i) * core::tensor_get_flat(t, i);
    return std::sqrt(sq);
}

void check_pytorch_reference(VisionConfig cfg) {
    cfg.patch = 14;  // the real patch: 588 values
    cfg.init_std = 0.05;
    Tower t(cfg, DType::f32);
    const VisionBatch batch = make_batch({{2, 4}, {4, 2}, {2, 2}, {6, 4}}, cfg, DType::f32, 4);
    Tensor r = Tensor::zeros({batch.num_tokens(), kDModel}, DType::f32);
    core::rng_fill_normal(r, 7, 2, 0.0, 1.0);
    t.table.zero_grads();
    const Tensor out = t.enc.forward(batch).clone();
    t.enc.backward(r);
    const std::string dir = mt::testing::fresh_dir("vision_golden_" + cfg.pos);
    std::vector<std::pair<std::string, Tensor>> in = {{"input.patches", batch.patches}, {"input.dout", r}};
    Tensor grids = Tensor::zeros({static_cast<int64_t>(batch.grids.size()), 2}, DType::i32);
    for (size_t i = 0; i < batch.grids.size(); ++i) {
        grids.data<int32_t>()[2 * i] = static_cast<int32_t>(batch.grids[i].h);
        grids.data<int32_t>()[2 * i + 1] = static_cast<int32_t>(batch.grids[i].w);
    }
    in.emplace_back("input.grids", grids);
    for (int i = 0; i < t.table.size(); ++i) in.emplace_back(t.table.spec(i).name, t.table.param(i));
    train::safetensors_write(dir + "/in.safetensors",
                             in,
                             {{"dim", std::to_string(cfg.dim)},
                              {"layers", std::to_string(cfg.layers)},
                              {"heads", std::to_string(cfg.heads)},
                              {"eps", fmt::format("{}", cfg.norm_eps)},
                              {"rope_base", fmt::format("{}", cfg.rope_base)},
                              {"pos", cfg.pos}});
    const char* env = std::getenv("MT_REFERENCE_PYTHON");
    const std::string python = env != nullptr ? env : "/usr/bin/python3";
    const std::string cmd = python + " " + MT_SOURCE_DIR + "/tools/reference/vision.py " + dir + "/in.safetensors " +
                            dir + "/out.safetensors";
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << cmd << " failed. HINT: install Debian's python3-torch (apt-get install python3-torch), or point "
        << "MT_REFERENCE_PYTHON at a Python that has torch";
    const train::SafetensorsFile ref(dir + "/out.safetensors");
    double worst = mt::testing::rho(out, ref.read("out"));
    EXPECT_LE(worst, 1e-5) << "out";
    EXPECT_LE(mt::testing::rho(t.enc.features(), ref.read("features")), 1e-5) << "features";
    int zero_grads = 0;
    for (int i = 0; i < t.table.size(); ++i) {
        const std::string& name = t.table.spec(i).name;
        const Tensor theirs = ref.read("grad." + name).reshape(t.table.grad(i).shape());
        if (!cfg.rope2d() && name.ends_with(".attn.k.bias")) {
            // Unrotated, a key bias b adds q.b to every logit of a query's row, which the softmax cancels: its
            // gradient is 0 in exact arithmetic, so both sides hold rounding noise, small against the key weight's.
            const double scale = l2(t.table.grad(t.index(name.substr(0, name.size() - 4) + "weight")));
            EXPECT_LE(l2(t.table.grad(i)), 1e-5 * scale) << name;
            EXPECT_LE(l2(theirs), 1e-5 * scale) << name;
            ++zero_grads;
            continue;
        }
        const double r_i = mt::testing::rho(t.table.grad(i), theirs);
        EXPECT_LE(r_i, 1e-5) << name;
        worst = std::max(worst, r_i);
    }
    EXPECT_EQ(zero_grads, cfg.rope2d() ? 0 : cfg.layers);
    std::printf("vision tower (%s) vs PyTorch: worst rho %.2e over the output and %d parameter gradients\n",
                cfg.pos.c_str(),
                worst,
                t.table.size());
}

TEST(VisionEncoder, MatchesThePyTorchReference) {
    check_pytorch_reference(tiny_config());
}

// A 5 x 5 table to grids of 2 .. 6 patches a side: down, up and the same size, through F.interpolate.
TEST(VisionEncoder, LearnedPositionsMatchThePyTorchReference) {
    check_pytorch_reference(learned(tiny_config(), 5));
}

TEST(VisionEncoder, RefusesBadBatchesAndShapes) {
    const VisionConfig cfg = tiny_config();
    Tower t(cfg, DType::f32);
    VisionBatch odd = make_batch({{3, 4}}, cfg, DType::f32, 3);
    EXPECT_THROW(t.enc.forward(odd), core::Error);
    VisionBatch short_patches = make_batch({{2, 2}}, cfg, DType::f32, 3);
    short_patches.grids = {{2, 4}};
    EXPECT_THROW(t.enc.forward(short_patches), core::Error);
    VisionConfig bad = cfg;
    bad.heads = 4;  // head dim 4: fine; 16 / 3 is not whole
    bad.heads = 3;
    ParamTable table;
    EXPECT_THROW(VisionEncoder(table, bad, kDModel), core::Error);
    // Learned positions need no rotation: any whole head dim (2 here), and a table of at least one cell.
    VisionConfig whole = learned(cfg);
    whole.heads = 8;  // head dim 2
    ParamTable ok_table;
    EXPECT_NO_THROW(VisionEncoder(ok_table, whole, kDModel));
    VisionConfig unknown = cfg;
    unknown.pos = "sincos";
    ParamTable t1, t2;
    EXPECT_THROW(VisionEncoder(t1, unknown, kDModel), core::Error);
    EXPECT_THROW(VisionEncoder(t2, learned(cfg, 0), kDModel), core::Error);
}

// The table's row of the parameter table: AdamW's with weight decay like the token embedding, normal init at
// vision.init_std, [G, G, dim]; absent with rope2d.
TEST(VisionEncoder, LearnedPositionTableIsAnAdamWEmbedding) {
    ParamTable table;
    VisionEncoder enc(table, learned(tiny_config(), 7), kDModel);
    const int i = table.find("vision.pos_embed.weight");
    ASSERT_GE(i, 0);
    const ParamSpec& spec = table.spec(i);
    EXPECT_EQ(spec.shape, (core::Shape{7, 7, 16}));
    EXPECT_EQ(spec.group, OptimGroup::adamw);
    EXPECT_TRUE(spec.weight_decay);
    EXPECT_EQ(spec.init, InitKind::normal);
    EXPECT_EQ(spec.init_std, 0.3);
    ParamTable rope_table;
    VisionEncoder rope(rope_table, tiny_config(), kDModel);
    EXPECT_LT(rope_table.find("vision.pos_embed.weight"), 0);
}

}  // namespace
}  // namespace mt::nn
