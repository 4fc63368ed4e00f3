// The memory planner's sequence segments (parallel/plan_segments.h) against a real segmented model on the CPU:
//   - the boundaries it draws are Model::segment_bounds() for the balanced split, fixed segment lengths and short
//     rows, on dense, hybrid, window and MoE models;
//   - what crosses the boundaries (the global attention caches and accumulators, the window layers' snapshots, KDA's
//     kept and carried states and halos, the row's losses) is exactly what a segmented model holds beyond the same
//     model run on one segment's tokens, counted by core::host_storage_bytes() after a forward and after a backward,
//     with long.offload_kv (the pinned part) and without, under recompute none, selective and full; its activations and
//     workspace are one segment's;
//   - on a GPU plan offload moves the caches to the host column and the staging into the transient.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "nn/model.h"
#include "parallel/plan_memory.h"
#include "train/config.h"
#include "train/plan_input.h"

namespace mt::parallel {
namespace {

using core::DType;
using core::Tensor;

nn::ModelConfig small(const std::string& pattern) {
    nn::ModelConfig c;
    c.vocab_size = 29, c.d_model = 16, c.n_layers = 5, c.n_heads = 4, c.n_kv_heads = 2, c.d_ff = 24;
    c.max_seq_len = 320, c.tie_embeddings = false, c.layer_pattern = pattern;
    c.kda.num_heads = 2, c.kda.num_v_heads = 4, c.kda.head_dim = 4, c.kda.head_v_dim = 4, c.kda.chunk_size = 32;
    return c;
}

nn::ModelConfig with_window(nn::ModelConfig c) {
    c.attn.window = 40;
    c.attn.window_layers = {2, 5};
    c.attn.global_tokens = 3;
    return c;
}

nn::ModelConfig with_moe(nn::ModelConfig c) {
    c.moe_enabled = true, c.moe_first_k_dense = 1;
    c.moe.num_experts = 6, c.moe.top_k = 2, c.moe.num_shared_experts = 1, c.moe.expert_ffn_dim = 8;
    return c;
}

struct Batch {
    Tensor ids, targets;
};

Batch batch_of(int64_t b, int64_t t, int64_t vocab) {
    Batch out{Tensor::zeros({b, t}, DType::i32), Tensor::zeros({b, t}, DType::i32)};
    for (int64_t i = 0; i < b * t; ++i) {
        core::tensor_set_flat(out.ids, i, static_cast<double>(core::rng_u64(5, 0, i) % vocab));
        core::tensor_set_flat(out.targets, i, static_cast<double>(core::rng_u64(6, 0, i) % vocab));
    }
    return out;
}

MemoryPlanInput cpu_input(const nn::ModelConfig& cfg, int64_t batch, int64_t seq) {
    MeshShape mesh;
    mesh.size = {1, 1, 1, 1, 1};
    return {.model = cfg, .precision = nn::Precision::cpu(DType::f32), .batch = batch, .seq = seq, .mesh = mesh};
}

TEST(PlanSegments, BoundsAreTheModels) {
    const std::vector<std::pair<std::string, nn::ModelConfig>> models = {{"dense", small("A")},
                                                                         {"hybrid", small("KAKKA")},
                                                                         {"window", with_window(small("KAKKA"))},
                                                                         {"moe", with_moe(small("KAKKA"))}};
    auto split = [](int64_t count, int64_t tokens) {
        nn::SegmentConfig s;
        s.count = count, s.tokens = tokens;
        return s;
    };
    const std::vector<std::pair<std::string, nn::SegmentConfig>> splits = {{"2 segments", split(2, 0)},
                                                                           {"3 segments", split(3, 0)},
                                                                           {"5 segments", split(5, 0)},
                                                                           {"32 tokens", split(1, 32)},
                                                                           {"64 tokens", split(1, 64)}};
    for (const auto& [model_name, base] : models)
        for (const auto& [split_name, segments] : splits)
            for (int64_t seq : {96, 160, 320}) {
                SCOPED_TRACE(fmt::format("{}, {}, {} tokens", model_name, split_name, seq));
                nn::ModelConfig cfg = base;
                cfg.segments = segments;
                nn::Model model(cfg, nn::Precision::cpu(DType::f32));
                model.params().initialize(3);
                const Batch b = batch_of(1, seq, cfg.vocab_size);
                model.forward(b.ids, b.targets);
                EXPECT_EQ(plan_segment_bounds(cfg, seq), model.segment_bounds());
                const MemoryPlan plan = plan_memory(cpu_input(cfg, 1, seq));
                EXPECT_EQ(plan.segments.count, static_cast<int64_t>(model.segment_bounds().size()) - 1);
                int64_t longest = 0;
                for (size_t j = 0; j + 1 < model.segment_bounds().size(); ++j)
                    longest = std::max(longest, model.segment_bounds()[j + 1] - model.segment_bounds()[j]);
                EXPECT_EQ(plan.segments.longest, longest);
            }
}

// Live host storage of a model from just after its construction: everything its passes allocated and still hold.
struct Held {
    int64_t cpu = 0, pinned = 0;
};

Held held_since(const core::HostStorageBytes& start) {
    const core::HostStorageBytes now = core::host_storage_bytes();
    return {now.cpu - start.cpu, now.pinned - start.pinned};
}

// A segmented model and the same model run on one segment's tokens hold the same activations; the difference is what
// the planner's segment buffers say (less dS_0, which the first segment's backward frees), plus the host copies of the
// whole row's ids and targets, which the planner leaves out (8 B (T - S) bytes more than one segment's).
TEST(PlanSegments, HeldBuffersEqualTheRealModels) {
    using M = nn::RecomputeModule;
    const std::vector<std::pair<std::string, nn::RecomputeConfig>> policies = {
        {"none", {}},
        {"selective", {.policy = nn::RecomputePolicy::selective, .modules = {M::attn_core, M::kda, M::norm}}},
        {"full every 1", {.policy = nn::RecomputePolicy::full, .every = 1}},
        {"full every 2", {.policy = nn::RecomputePolicy::full, .every = 2}}};
    const std::vector<std::pair<std::string, nn::ModelConfig>> models = {{"dense", small("A")},
                                                                         {"hybrid", small("KAKKA")},
                                                                         {"window", with_window(small("KAKKA"))},
                                                                         {"moe", with_moe(small("KAKKA"))}};
    for (const auto& [model_name, base] : models)
        for (const auto& [policy_name, policy] : policies)
            for (bool offload : {false, true})
                for (auto [batch, seq] : {std::pair<int64_t, int64_t>{2, 128}, {1, 96}}) {
                    SCOPED_TRACE(fmt::format(
                        "{}, {}, offload {}, {} x {} tokens", model_name, policy_name, offload, batch, seq));
                    const int64_t len = 32;
                    nn::ModelConfig cfg = base;
                    cfg.recompute = policy;
                    cfg.segments.tokens = len;
                    cfg.segments.offload_kv = offload;
                    const MemoryPlan plan = plan_memory(cpu_input(cfg, batch, seq));
                    ASSERT_EQ(plan.segments.count, seq / len);
                    int64_t expect_cpu = 8 * batch * (seq - len), expect_pinned = 0, all = 0;
                    for (const PlanSegmentBuffer& b : plan.segments.buffers) {
                        all += b.bytes();
                        if (!b.backward_only)
                            (b.where == SegmentWhere::pinned ? expect_pinned : expect_cpu) += b.bytes();
                    }
                    EXPECT_EQ(plan.segments.device, all);  // a CPU run's host memory is its device
                    EXPECT_EQ(plan.segments.host, 0);
                    EXPECT_EQ(expect_pinned > 0, offload);

                    const nn::Precision cpu = plan.input.precision;
                    const Batch row = batch_of(batch, seq, cfg.vocab_size), part = batch_of(batch, len, cfg.vocab_size);
                    const core::HostStorageBytes seg_start = core::host_storage_bytes();
                    nn::Model seg(cfg, cpu);
                    seg.params().initialize(3);
                    seg.forward(row.ids, row.targets);  // the first step sizes everything; the second is steady
                    seg.backward(1.0);
                    seg.forward(row.ids, row.targets);
                    const Held seg_fwd = held_since(seg_start);
                    EXPECT_EQ(plan.saved_total, static_cast<int64_t>(seg.saved_activation_bytes()));
                    EXPECT_EQ(static_cast<int64_t>(seg.last_token_losses().nbytes()), batch * seq * 4);
                    seg.backward(1.0);
                    const Held seg_bwd = held_since(seg_start);
                    EXPECT_EQ(plan.workspace, static_cast<int64_t>(seg.workspace_bytes()));

                    nn::ModelConfig one_cfg = cfg;
                    one_cfg.segments = {};
                    const core::HostStorageBytes one_start = core::host_storage_bytes();
                    nn::Model one(one_cfg, cpu);
                    one.params().initialize(3);
                    one.forward(part.ids, part.targets);
                    one.backward(1.0);
                    one.forward(part.ids, part.targets);
                    const Held one_fwd = held_since(one_start);
                    one.backward(1.0);
                    const Held one_bwd = held_since(one_start);

                    EXPECT_EQ(seg_fwd.cpu - one_fwd.cpu, expect_cpu) << "after the forward";
                    EXPECT_EQ(seg_fwd.pinned - one_fwd.pinned, expect_pinned) << "after the forward";
                    EXPECT_EQ(seg_bwd.cpu - one_bwd.cpu, expect_cpu) << "after the backward";
                    EXPECT_EQ(seg_bwd.pinned - one_bwd.pinned, expect_pinned) << "after the backward";
                }
}

// A GPU plan of hybrid_1b3 at a million tokens in 16 segments (6 attention layers with 4 kv heads of 128): the caches
// are 1 GiB per tensor and layer; offload moves them, the accumulators and KDA's kept states and halos to the host
// column and puts the staged key rows into the transient.
TEST(PlanSegments, OffloadMovesTheCachesToTheHost) {
    auto plan_of = [](std::vector<std::string> set) {
        for (const char* s : {"model.max_seq_len=1048576",
                              "train.seq_len=1048576",
                              "train.batch_size=1",
                              "recompute.policy=\"full\"",
                              "model.n_kv_heads=4"})
            set.emplace_back(s);
        return plan_memory(
            train::plan_memory_input(train::config_load(std::string(MT_SOURCE_DIR) + "/configs/hybrid_1b3.toml", set)));
    };
    const MemoryPlan one = plan_of({});
    const MemoryPlan dev = plan_of({"long.segment_tokens=65536"});
    const MemoryPlan off = plan_of({"long.segment_tokens=65536", "long.offload_kv=true"});
    ASSERT_EQ(dev.input.precision.device, core::Device::cuda);
    EXPECT_EQ(one.segments.count, 1);
    EXPECT_TRUE(one.segments.buffers.empty());
    EXPECT_EQ(one.host_peak(), 0);
    for (const MemoryPlan* p : {&dev, &off}) {
        EXPECT_EQ(p->segments.count, 16);
        EXPECT_EQ(p->segments.longest, 65536);
        EXPECT_EQ(p->segments.peak_length, 65536);
        EXPECT_LT(p->peak, one.peak);  // one segment's activations instead of the row's
        EXPECT_EQ(p->state_device(), one.state_device());
    }
    const int64_t gib = int64_t{1} << 30, losses = 4 * 1048576;
    int64_t caches = 0;
    for (const PlanSegmentBuffer& b : dev.segments.buffers)
        if (b.name.starts_with("attention.")) caches += b.bytes();
    EXPECT_EQ(caches, 6 * 4 * gib);  // K, V, dK, dV of 6 layers
    EXPECT_EQ(dev.segments.host, losses);
    EXPECT_EQ(dev.host_peak(), losses);
    EXPECT_GT(off.segments.host, caches);  // the caches, KDA's kept states and halos and the losses
    EXPECT_EQ(
        off.segments.host + off.segments.device,
        dev.segments.host + dev.segments.device + [&] {  // the device copies of the carried states, halos
            int64_t copies = 0;
            for (const PlanSegmentBuffer& b : off.segments.buffers)
                if (b.name.starts_with("kda.carried")) copies += b.bytes();
            for (const PlanSegmentBuffer& b : dev.segments.buffers)
                if (b.name.starts_with("kda.carried")) copies -= b.bytes();
            return copies;
        }());
    EXPECT_LT(off.segments.device, gib);
    EXPECT_LT(off.peak, dev.peak - 20 * gib);
    // Without offload the KDA backward's chunk workspace is the largest transient; with it, the key rows staged for
    // the attention layer before sit beside it.
    EXPECT_EQ(dev.segments.transient_keys, 0) << dev.transient_at;
    EXPECT_EQ(off.segments.transient_keys, 4 * gib) << off.transient_at;
    const std::string table = memory_plan_table(off);
    EXPECT_NE(table.find("1 x 1048576 = 1,048,576 tokens per micro-batch in 16 segments of up to 65,536"),
              std::string::npos)
        << table;
    const nlohmann::json json = memory_plan_json(off);
    EXPECT_EQ(json["segments"]["count"], 16);
    EXPECT_EQ(json["host_bytes"], off.host_peak());
}

}  // namespace
}  // namespace mt::parallel
