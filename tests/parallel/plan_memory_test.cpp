// The memory planner (parallel/plan_memory.h) against the real thing on the CPU:
//   - Model::param_layout lays out the table a finalized model has (offsets, padding, totals), without arenas;
//   - the state bytes equal the Trainer's (state_bytes, optimizer_state_bytes) on configs/tiny*.toml, and under
//     ZeRO-1 (dp = 2 and 4, ep = 2) real optim::AdamWs (f32 and bf16 moments) over the bucket plan's owned slices;
//   - the saved activations after the forward equal Model::saved_activation_bytes(), and the workspace after the
//     backward Model::workspace_bytes(), exactly, for dense, hybrid (KKKA), MoE and AttnRes models under every
//     recompute policy (none, each selective module, all of them, full every 1, 2 and sqrt);
//   - the vision tower: the bound on a micro-batch's image slots against a brute force, and its saved and kept buffers
//     equal a real model's encoder on a batch that holds exactly the bound (rope2d and learned positions, a projector
//     width of its own, recompute full); shapes_tiny plans its tower;
//   - kimi_linear_mini (2.57B parameters) plans in well under a second.
#include "parallel/plan_memory.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "optim/adamw.h"
#include "parallel/grad_sync.h"
#include "support/tiny_job.h"
#include "train/plan_input.h"
#include "train/trainer.h"

namespace mt::parallel {
namespace {

using core::DType;
using core::Tensor;

train::JobConfig shipped(const std::string& name,
                         std::vector<std::string> overrides = {},
                         const std::string& device = "cpu") {
    overrides.push_back("run.device=\"" + device + "\"");
    return train::config_load(std::string(MT_SOURCE_DIR) + "/configs/" + name, overrides);
}

MeshShape mesh_of(int64_t ep, int64_t dp) {
    MeshShape s;
    s.size = {1, 1, ep, dp, 1};
    return s;
}

// The tiny configs, with Block AttnRes added to the MoE one so that every layer type has a parameter.
std::vector<train::JobConfig> tiny_configs() {
    return {shipped("tiny.toml"),
            shipped("tiny_hybrid.toml"),
            shipped("tiny_moe.toml"),
            shipped("tiny_moe.toml", {"attnres.mode=\"block\"", "attnres.block_size=4"})};
}

TEST(PlanMemory, ParamLayoutIsTheFinalizedTablesLayout) {
    for (const train::JobConfig& cfg : tiny_configs()) {
        SCOPED_TRACE(cfg.source);
        for (int64_t align : {1, 4, 6}) {
            const nn::Precision cpu = nn::Precision::cpu(DType::f32);
            const nn::Model model(cfg.model, cpu, align);
            const nn::ParamTable layout = nn::Model::param_layout(cfg.model, cpu, align);
            const nn::ParamTable& real = model.params();
            ASSERT_EQ(layout.size(), real.size());
            EXPECT_EQ(layout.total_numel(), real.total_numel());
            EXPECT_EQ(layout.arena_bytes(DType::f32), static_cast<int64_t>(real.master_arena().nbytes()));
            for (int i = 0; i < real.size(); ++i) {
                EXPECT_EQ(layout.spec(i).name, real.spec(i).name);
                EXPECT_EQ(layout.offset(i), real.offset(i));
                EXPECT_EQ(layout.padded_numel(i), real.padded_numel(i));
            }
        }
    }
}

// dp = 1: the Trainer's own figures, on the tiny job's shards with each shipped model.
TEST(PlanMemory, StateBytesEqualTheTrainersOnOneRank) {
    const std::string dir = testing::fresh_dir("state");
    // The optimizer's settings change the state: offload's own master arena, bf16 moments.
    const std::vector<std::vector<std::string>> optim = {{},
                                                         {"optim.offload=\"cpu\""},
                                                         {"optim.state_dtype=\"bf16\""},
                                                         {"optim.offload=\"cpu\"", "optim.state_dtype=\"bf16\""}};
    for (const char* model : {"tiny.toml", "tiny_hybrid.toml", "tiny_moe.toml"})
        for (const std::vector<std::string>& settings : optim) {
            SCOPED_TRACE(fmt::format("{} {}", model, fmt::join(settings, " ")));
            const train::JobConfig shipped_cfg = shipped(model);
            train::JobConfig cfg = testing::tiny_job(dir, settings);
            cfg.model = shipped_cfg.model;
            cfg.run.device = "cpu";  // what the trainer runs here; "auto" would plan for a GPU
            cfg.model.max_seq_len = std::max(cfg.model.max_seq_len, cfg.train.seq_len);
            train::Trainer trainer(cfg, false);
            const MemoryPlan plan = plan_memory(train::plan_memory_input(cfg));
            EXPECT_EQ(plan.state_bytes(), trainer.state_bytes());
            EXPECT_EQ(plan.optimizer, trainer.optimizer_state_bytes());
            const nn::ParamTable& table = trainer.model().params();
            int64_t params = 0;
            for (int i = 0; i < table.size(); ++i) params += core::shape_numel(table.spec(i).shape);
            EXPECT_EQ(plan.params_global, params);
            EXPECT_EQ(plan.arena_numel, table.total_numel());
            EXPECT_FALSE(plan.zero);
            EXPECT_EQ(plan.zero_staging, 0);
        }
}

// The owned slices GradSync gives data rank `dp_rank`, expert rank `ep_rank` (its constructor, without a mesh).
std::vector<optim::ArenaRange> owned_slices(
    const nn::ParamTable& table, double bucket_mb, int64_t ep, int64_t dp, int64_t ep_rank, int64_t dp_rank) {
    std::vector<ArenaParam> params;
    for (int i = 0; i < table.size(); ++i)
        params.push_back({table.offset(i),
                          table.grad(i).numel(),
                          table.offset(i) + table.padded_numel(i),
                          nn::param_expert_sharded(table.spec(i))});
    std::vector<optim::ArenaRange> owned;
    for (const GradBucketRange& b : grad_sync_buckets(params, 4, bucket_mb)) {
        // dp_span is ep x dp with ep fastest (rank order tp-cp-ep-dp-pp); edp is dp.
        const int64_t group = b.expert ? dp : ep * dp, rank = b.expert ? dp_rank : dp_rank * ep + ep_rank;
        const int64_t share = (b.end - b.begin) / group;
        owned.push_back({b.begin + rank * share, b.begin + (rank + 1) * share});
    }
    std::sort(owned.begin(), owned.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    return owned;
}

TEST(PlanMemory, ZeroOneShardsMatchARealAdamWOverTheBucketPlan) {
    struct Layout {
        int64_t ep, dp;
    };
    for (const train::JobConfig& base : tiny_configs()) {
        for (const Layout& lay : {Layout{1, 2}, Layout{1, 4}, Layout{2, 1}, Layout{2, 2}}) {
            if (lay.ep > 1 && !base.model.moe_enabled) continue;
            for (double bucket_mb : {25.0, 0.01}) {  // one bucket, and one per parameter or so
                SCOPED_TRACE(fmt::format("{} ep={} dp={} bucket_mb={}", base.source, lay.ep, lay.dp, bucket_mb));
                MemoryPlanInput in{.model = base.model,
                                   .precision = nn::Precision::cpu(DType::f32),
                                   .batch = 1,
                                   .seq = 8,
                                   .mesh = mesh_of(lay.ep, lay.dp),
                                   .bucket_mb = bucket_mb};
                const MemoryPlan plan = plan_memory(in);
                in.state_dtype = DType::bf16;
                const MemoryPlan bf16 = plan_memory(in);
                EXPECT_TRUE(plan.zero);
                const int64_t align = lay.ep * lay.dp;
                for (int64_t ep_rank = 0; ep_rank < lay.ep; ++ep_rank) {
                    nn::MoeExpertParallel ep;
                    if (base.model.moe_enabled) ep = {.size = lay.ep, .rank = ep_rank};
                    nn::Model model(base.model, in.precision, align, ep);
                    EXPECT_EQ(plan.arena_numel, model.params().total_numel());
                    EXPECT_EQ(plan.grads, static_cast<int64_t>(model.params().grad_arena().nbytes()));
                    for (int64_t dp_rank = 0; dp_rank < lay.dp; ++dp_rank) {
                        const optim::AdamW adamw(
                            model.params(),
                            {},
                            owned_slices(model.params(), bucket_mb, lay.ep, lay.dp, ep_rank, dp_rank));
                        EXPECT_EQ(plan.optimizer, adamw.state_bytes()) << "rank ep " << ep_rank << " dp " << dp_rank;
                        const optim::AdamW adamw_bf16(
                            model.params(),
                            {},
                            owned_slices(model.params(), bucket_mb, lay.ep, lay.dp, ep_rank, dp_rank),
                            {.state_dtype = DType::bf16});
                        EXPECT_EQ(bf16.optimizer, adamw_bf16.state_bytes());
                        // GradSync's staging holds the owned slices' reduced gradients.
                        EXPECT_EQ(plan.zero_staging, adamw.state_bytes() / 2);
                    }
                }
            }
        }
    }
}

// ---- activations ----

nn::ModelConfig small(const std::string& pattern) {
    nn::ModelConfig c;
    c.vocab_size = 29, c.d_model = 16, c.n_layers = 5, c.n_heads = 4, c.n_kv_heads = 2, c.d_ff = 24;
    c.max_seq_len = 48, c.tie_embeddings = false, c.layer_pattern = pattern;
    c.kda.num_heads = 2, c.kda.num_v_heads = 4, c.kda.head_dim = 4, c.kda.head_v_dim = 4, c.kda.chunk_size = 32;
    return c;
}

nn::ModelConfig with_moe(nn::ModelConfig c, nn::MoeBalanceMode balance = nn::MoeBalanceMode::quantile) {
    c.moe_enabled = true, c.moe_first_k_dense = 1;
    c.moe.num_experts = 6, c.moe.top_k = 2, c.moe.num_shared_experts = 1, c.moe.expert_ffn_dim = 8;
    c.moe.balance.mode = balance;
    return c;
}

nn::ModelConfig with_attnres(nn::ModelConfig c) {
    c.attnres.mode = nn::AttnResMode::block;
    c.attnres.block_size = 4;
    return c;
}

struct ActCase {
    std::string name;
    nn::ModelConfig cfg;
};

std::vector<ActCase> act_cases() {
    std::vector<ActCase> cases = {{"dense", small("A")},
                                  {"hybrid", small("KAKKA")},
                                  {"moe", with_moe(small("A"))},
                                  {"moe_aux_loss", with_moe(small("KA"), nn::MoeBalanceMode::aux_loss)},
                                  {"attnres", with_attnres(small("A"))},
                                  {"hybrid_moe_attnres", with_attnres(with_moe(small("KAKKA")))}};
    cases[3].cfg.n_layers = 4;  // "KA" repeats over an even count
    // Window layers 2 and 5 of the hybrid: their global tokens' keys and values are kept (long_context.md §2).
    nn::ModelConfig window = small("KAKKA");
    window.attn.window = 8;
    window.attn.window_layers = {2, 5};
    window.attn.global_tokens = 3;
    window.attn.sink_logit = true;
    cases.push_back({"hybrid_window", window});
    for (const char* name : {"tiny.toml", "tiny_hybrid.toml", "tiny_moe.toml"}) {
        nn::ModelConfig c = shipped(name).model;
        c.max_seq_len = 48;
        cases.push_back({name, c});
    }
    return cases;
}

std::vector<std::pair<std::string, nn::RecomputeConfig>> policies(const nn::ModelConfig& cfg) {
    using M = nn::RecomputeModule;
    auto selective = [](std::vector<M> m) {
        return nn::RecomputeConfig{.policy = nn::RecomputePolicy::selective, .modules = std::move(m)};
    };
    std::vector<std::pair<std::string, nn::RecomputeConfig>> all = {{"none", {}}};
    for (M m : {M::attn_core, M::kda, M::mlp_act, M::moe_act, M::norm, M::attnres, M::moe_permute, M::moe_experts})
        all.emplace_back(nn::enum_name(m), selective({m}));
    all.emplace_back(
        "all modules",
        selective({M::attn_core, M::kda, M::mlp_act, M::moe_act, M::norm, M::attnres, M::moe_permute, M::moe_experts}));
    all.emplace_back("full every 1", nn::RecomputeConfig{.policy = nn::RecomputePolicy::full, .every = 1});
    if (!cfg.attnres.enabled()) {  // every > 1 needs the plain residual stream
        all.emplace_back("full every 2", nn::RecomputeConfig{.policy = nn::RecomputePolicy::full, .every = 2});
        all.emplace_back("full every sqrt", nn::RecomputeConfig{.policy = nn::RecomputePolicy::full, .every = 0});
    }
    return all;
}

TEST(PlanMemory, SavedActivationsAndWorkspaceEqualTheRealModels) {
    const int64_t batch = 2, seq = 40;
    for (const ActCase& c : act_cases()) {
        for (const auto& [policy_name, policy] : policies(c.cfg)) {
            SCOPED_TRACE(c.name + ", " + policy_name);
            nn::ModelConfig cfg = c.cfg;
            cfg.recompute = policy;
            const nn::Precision cpu = nn::Precision::cpu(DType::f32);
            nn::Model model(cfg, cpu);
            model.params().initialize(3);
            Tensor ids = Tensor::zeros({batch, seq}, DType::i32), targets = Tensor::zeros({batch, seq}, DType::i32);
            for (int64_t i = 0; i < ids.numel(); ++i) {
                core::tensor_set_flat(ids, i, static_cast<double>(core::rng_u64(5, 0, i) % cfg.vocab_size));
                core::tensor_set_flat(targets, i, static_cast<double>(core::rng_u64(6, 0, i) % cfg.vocab_size));
            }
            const MemoryPlan plan =
                plan_memory({.model = cfg, .precision = cpu, .batch = batch, .seq = seq, .mesh = mesh_of(1, 1)});
            for (int step = 0; step < 2; ++step) {  // the first step sizes everything; the second is a steady one
                model.forward(ids, targets);
                EXPECT_EQ(plan.saved_total, static_cast<int64_t>(model.saved_activation_bytes())) << "step " << step;
                model.backward(1.0);
                EXPECT_EQ(plan.workspace, static_cast<int64_t>(model.workspace_bytes())) << "step " << step;
            }
        }
    }
}

// ---- the vision tower ----

// The bound on a micro-batch's image slots against a brute force over rows: the most slots a row of `seq` tokens
// holds with images of 1..M slots, each with `frame` tokens of its sample beside it (a knapsack over the images).
TEST(PlanMemory, ImageSlotsAreTheMostARowCanHold) {
    for (int64_t frame : {3, 16})
        for (int64_t m = 1; m <= 20; ++m)
            for (int64_t seq = 1; seq <= 90; ++seq) {
                std::vector<int64_t> best(static_cast<size_t>(seq + 1), 0);  // the most slots within x tokens
                for (int64_t x = 1; x <= seq; ++x)
                    for (int64_t t = 1; t <= m && t + frame <= x; ++t)
                        best[static_cast<size_t>(x)] =
                            std::max(best[static_cast<size_t>(x)], best[static_cast<size_t>(x - t - frame)] + t);
                EXPECT_EQ(plan_image_slots(3, seq, m, frame), 3 * best[static_cast<size_t>(seq)])
                    << "seq " << seq << ", images of up to " << m << " slots, frame " << frame;
            }
    EXPECT_EQ(plan_image_slots(2, 40, 0), 0);
}

nn::ModelConfig with_vision(nn::ModelConfig c, const std::string& pos = "rope2d") {
    c.vision.layers = 2, c.vision.dim = 16, c.vision.heads = 2, c.vision.mlp = 24, c.vision.image_token = 3;
    c.vision.pos = pos, c.vision.pos_grid = 4;
    return c;
}

// A micro-batch that holds exactly the planned image slots: 2 rows of 40 tokens, each with five 4 x 4-patch images (4
// slots each) and a 2 x 4 one (2 slots), every image framed by 3 text tokens: 22 slots per row, the bound for images of
// at most 4 slots. The planner's vision line (its saved buffers and, after the backward, the ones it keeps besides)
// and its saved total equal the real model's allocation, as the LM's do above.
TEST(PlanMemory, VisionTowerEqualsTheRealEncoder) {
    const int64_t batch = 2, seq = 40, image_tokens = 4;
    std::vector<nn::ModelConfig> cfgs = {
        with_vision(small("A")), with_vision(with_moe(small("KA")), "learned"), with_vision(small("A"))};
    cfgs[1].n_layers = 4;
    cfgs[2].vision.projector_hidden = 40;
    cfgs[2].recompute = {.policy = nn::RecomputePolicy::full, .every = 1};
    for (const nn::ModelConfig& cfg : cfgs) {
        SCOPED_TRACE(
            fmt::format("{} {} projector {}", cfg.layer_pattern, cfg.vision.pos, cfg.vision.projector_width()));
        const nn::Precision cpu = nn::Precision::cpu(DType::f32);
        nn::Model model(cfg, cpu);
        model.params().initialize(3);
        Tensor ids = Tensor::zeros({batch, seq}, DType::i32), targets = Tensor::zeros({batch, seq}, DType::i32);
        nn::VisionBatch images;
        for (int64_t b = 0; b < batch; ++b) {
            int64_t at = b * seq;
            for (const nn::ImageGrid g : {nn::ImageGrid{4, 4},
                                          nn::ImageGrid{4, 4},
                                          nn::ImageGrid{2, 4},
                                          nn::ImageGrid{4, 4},
                                          nn::ImageGrid{4, 4},
                                          nn::ImageGrid{4, 4}}) {
                images.grids.push_back(g);
                for (int64_t i = 0; i < g.tokens() + 3; ++i, ++at)  // <bos> <img_start> slots <img_end>, as ids 5 6 3 7
                    core::tensor_set_flat(ids, at, i == 0 ? 5 : i == 1 ? 6 : i < g.tokens() + 2 ? 3 : 7);
            }
            ASSERT_EQ(at, (b + 1) * seq);
        }
        for (int64_t i = 0; i < targets.numel(); ++i)
            core::tensor_set_flat(targets, i, static_cast<double>(core::rng_u64(6, 0, i) % cfg.vocab_size));
        images.patches = Tensor::zeros({images.num_patches(), cfg.vision.patch_values()}, DType::f32);
        for (int64_t i = 0; i < images.patches.numel(); ++i)
            core::tensor_set_flat(images.patches, i, core::rng_uniform(7, 0, static_cast<uint64_t>(i)) - 0.5);
        const MemoryPlan plan = plan_memory({.model = cfg,
                                             .precision = cpu,
                                             .batch = batch,
                                             .seq = seq,
                                             .mesh = mesh_of(1, 1),
                                             .image_tokens = image_tokens});
        ASSERT_EQ(plan.vision_tokens, images.num_tokens());
        ASSERT_EQ(plan.vision_patches, images.num_patches());
        const MemoryActivations& vision = plan.activations[static_cast<size_t>(PlanKind::vision)];
        for (int step = 0; step < 2; ++step) {
            model.set_vision_batch(images);
            model.forward(ids, targets);
            EXPECT_EQ(vision.saved, model.vision()->saved_activation_bytes()) << "step " << step;
            EXPECT_EQ(plan.saved_total, static_cast<int64_t>(model.saved_activation_bytes())) << "step " << step;
            model.backward(1.0);
            // The encoder's gradient buffers and positions, and the model's slot indices (i32, one per slot).
            EXPECT_EQ(vision.held, model.vision()->held_bytes() + 4 * images.num_tokens()) << "step " << step;
            EXPECT_EQ(plan.workspace, static_cast<int64_t>(model.workspace_bytes())) << "step " << step;
        }
    }
}

// A shipped image config plans its tower: shapes_tiny's 112-pixel canvases (16 slots an image) with the shortest
// caption's 16 tokens beside each, in rows of 128 tokens: at most 64 slots a row.
TEST(PlanMemory, ShapesTinyPlansItsVisionTower) {
    const train::JobConfig cfg = shipped("shapes_tiny.toml");
    const parallel::MemoryPlanInput in = train::plan_memory_input(cfg);
    EXPECT_EQ(in.image_tokens, 16);
    EXPECT_EQ(in.image_frame_tokens, 16);
    const MemoryPlan plan = plan_memory(in);
    EXPECT_EQ(plan.vision_tokens, cfg.train.batch_size * 64);
    EXPECT_EQ(plan.vision_patches, 4 * plan.vision_tokens);
    const MemoryActivations& vision = plan.activations[static_cast<size_t>(PlanKind::vision)];
    EXPECT_GT(vision.saved, 0);
    EXPECT_GT(vision.held, 0);
    const std::string table = memory_plan_table(plan);
    EXPECT_NE(table.find("vision (2 ViT blocks, projector)"), std::string::npos) << table;
    EXPECT_EQ(memory_plan_json(plan).at("vision").at("patches").get<int64_t>(), plan.vision_patches);
    // The text-only twin has no images.
    const train::JobConfig twin = shipped("shapes_tiny.toml", {"data.shapes.text_only=true"});
    EXPECT_EQ(plan_memory(train::plan_memory_input(twin)).vision_tokens, 0);
}

// The shipped configs' plans: the largest model plans in milliseconds, and the figures hold together.
TEST(PlanMemory, KimiLinearMiniPlansFastAndConsistently) {
    train::JobConfig cfg = shipped("kimi_linear_mini.toml", {}, "auto");
    const auto start = std::chrono::steady_clock::now();
    const MemoryPlan plan = plan_memory(train::plan_memory_input(cfg));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 1.0);
    EXPECT_EQ(plan.params_global, 2'572'148'880);  // the count the config's header states
    EXPECT_EQ(plan.input.precision.device, core::Device::cuda);
    // bf16 weights, f32 gradients, master weights and both moments: 18 bytes per (padded) arena element.
    EXPECT_EQ(plan.state_bytes(), 18 * plan.arena_numel);
    int64_t saved = 0;
    for (const MemoryActivations& a : plan.activations) saved += a.saved;
    EXPECT_EQ(saved, plan.saved_total);
    EXPECT_GT(plan.peak, plan.state_device() + plan.saved_total + plan.workspace);
    EXPECT_GE(plan.transient, 0);
    // Offload moves the master weights and moments to the host; bf16 moments halve them.
    cfg.optim.offload = "cpu";
    cfg.optim.state_dtype = "bf16";
    const MemoryPlan off = plan_memory(train::plan_memory_input(cfg));
    EXPECT_EQ(off.state_host(), plan.master + plan.optimizer / 2);
    EXPECT_EQ(off.state_device(), plan.weights + plan.grads);
    EXPECT_EQ(off.peak, plan.peak - plan_cuda_size_class(plan.master) - plan_cuda_size_class(plan.optimizer));
}

}  // namespace
}  // namespace mt::parallel
