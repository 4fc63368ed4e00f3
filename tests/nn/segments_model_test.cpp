// Sequence segments through the whole model (long_context.md §4 and §10 test 3): the tiny hybrid with KDA, global
// and window attention layers, MoE and Block AttnRes, run as J in {2, 3, 7} segments with uneven splits (mid-chunk
// ones included), gives the loss and every parameter gradient of one pass (f64 rho <= 1e-12, f32 <= 1e-5), and its
// MoE layers count the routing once: the step's loads, the balancer's state (bias, counters, QB histogram) equal the
// one-pass run's exactly. Also with document masking (documents crossing a boundary, one starting exactly at one),
// under recompute policies, and the boundaries that long.segments / long.segment_tokens pick.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

constexpr int32_t kEot = 36;
constexpr int64_t kB = 2, kT = 100;

ModelConfig tiny_hybrid() {
    ModelConfig c;
    c.vocab_size = 37;
    c.d_model = 16;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 128;
    c.init_std = 0.2;
    c.layer_pattern = "KAKA";  // layer 2 global attention, layer 4 a window layer
    c.kda.num_heads = 2;
    c.kda.head_dim = 4;
    c.kda.chunk_size = 32;
    c.attn.window = 9;
    c.attn.window_layers = {4};
    c.attn.global_tokens = 2;
    c.attn.sink_logit = true;
    c.attn.window_rope_base = 10000.0;
    c.moe_enabled = true;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 8;
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 4;
    c.loss_chunk_tokens = 48;  // a head chunk boundary that no segment boundary matches
    c.eot_token = kEot;
    return c;
}

struct Batch {
    Tensor ids, targets;
};

// Random tokens; with documents, EOTs end documents at 31 (the next starts at 32, a segment boundary below), 57 and
// 88 in row 0 and at 10 in row 1. Every seventh target is ignored.
Batch make_batch(bool documents) {
    Batch b{Tensor::zeros({kB, kT}, DType::i32), Tensor::zeros({kB, kT}, DType::i32)};
    for (int64_t r = 0; r < kB; ++r)
        for (int64_t t = 0; t < kT; ++t) {
            auto id = static_cast<int32_t>(core::rng_u64(5, r, t) % kEot);
            if (documents && ((r == 0 && (t == 31 || t == 57 || t == 88)) || (r == 1 && t == 10))) id = kEot;
            core::tensor_set_flat(b.ids, r * kT + t, id);
            const double target = t % 7 == 3 ? kIgnoreIndex : static_cast<double>(core::rng_u64(5, 9, r * kT + t) % 37);
            core::tensor_set_flat(b.targets, r * kT + t, target);
        }
    return b;
}

struct Outcome {
    double loss = 0.0;
    Tensor grads;
    std::vector<std::vector<int64_t>> loads;          // per MoE layer, the step's per-expert loads
    std::vector<std::vector<Tensor>> balancer_state;  // per MoE layer, after step_end
    std::vector<int64_t> bounds;
};

// steps > 1: the same batch again from zeroed gradients (what a step leaves in the caches must not leak into the next).
Outcome run(ModelConfig cfg,
            DType dtype,
            const std::vector<int64_t>& bounds,
            bool documents,
            bool offload = false,
            int steps = 1,
            int64_t rows = kB) {
    cfg.segments.bounds = bounds;
    cfg.segments.offload_kv = offload;
    cfg.document_mask = documents;
    Model model(cfg, Precision::cpu(dtype));
    model.params().initialize(7);
    model.params().zero_grads();
    Batch batch = make_batch(documents);
    if (rows < kB)  // the first rows alone (one row: the caches are read as views, not copies)
        for (Tensor* t : {&batch.ids, &batch.targets}) *t = t->slice(0, 0, rows).clone();
    Outcome out;
    for (int step = 0; step < steps; ++step) {
        model.params().zero_grads();
        out.loss = model.forward(batch.ids, batch.targets);
        out.bounds = model.segment_bounds();
        model.backward(1.0);
    }
    out.grads = model.params().grad_arena().to(DType::f64);
    for (auto& [l, moe] : model.moe_layers()) {
        out.loads.push_back(moe->step_end(0).load);
        std::vector<Tensor> state;
        for (auto& [name, t] : moe->state_tensors()) state.push_back(t.to(DType::f64));
        out.balancer_state.push_back(state);
    }
    return out;
}

// The largest |a - b| over the elements (0: bitwise equal values).
double max_abs_diff(const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.numel(), b.numel());
    double m = 0.0;
    for (int64_t i = 0; i < a.numel() && i < b.numel(); ++i)
        m = std::max(m, std::abs(core::tensor_get_flat(a, i) - core::tensor_get_flat(b, i)));
    return m;
}

void expect_counted_once(const Outcome& segmented, const Outcome& one) {
    ASSERT_FALSE(one.loads.empty());
    EXPECT_EQ(segmented.loads, one.loads);
    ASSERT_EQ(segmented.balancer_state.size(), one.balancer_state.size());
    for (size_t l = 0; l < one.balancer_state.size(); ++l) {
        ASSERT_EQ(segmented.balancer_state[l].size(), one.balancer_state[l].size());
        for (size_t i = 0; i < one.balancer_state[l].size(); ++i)
            EXPECT_EQ(max_abs_diff(segmented.balancer_state[l][i], one.balancer_state[l][i]), 0.0)
                << "MoE layer " << l << " state tensor " << i;
    }
}

struct Split {
    const char* name;
    std::vector<int64_t> bounds;
};

// J = 2, 3, 7: mid-chunk cuts (chunk 32), a cut on a chunk boundary, a segment as short as 5 tokens.
// J4: a middle segment of 4 tokens, shorter than the window layer's w - 1 = 8, so the next segment's window reaches
// through it into the one before (its snapshot and its gradients span two segments).
const Split kSplits[] = {
    {"J2", {37}}, {"J3", {32, 70}}, {"J7", {5, 20, 32, 45, 64, 90}}, {"J4_short_middle", {20, 24, 60}}};

class SegmentsModel : public ::testing::TestWithParam<bool> {};  // document masking off / on

TEST_P(SegmentsModel, SegmentsEqualOnePassF64) {
    const bool documents = GetParam();
    const Outcome one = run(tiny_hybrid(), DType::f64, {}, documents);
    ASSERT_EQ(one.bounds, (std::vector<int64_t>{0, kT}));
    for (const Split& s : kSplits) {
        SCOPED_TRACE(s.name);
        const Outcome seg = run(tiny_hybrid(), DType::f64, s.bounds, documents);
        ASSERT_EQ(seg.bounds.size(), s.bounds.size() + 2);
        EXPECT_NEAR(seg.loss, one.loss, 1e-12 * std::abs(one.loss));
        EXPECT_LE(mt::testing::rho(seg.grads, one.grads), 1e-12);
        expect_counted_once(seg, one);
    }
}

TEST_P(SegmentsModel, SegmentsEqualOnePassF32) {
    const bool documents = GetParam();
    const Outcome one = run(tiny_hybrid(), DType::f32, {}, documents);
    for (const Split& s : kSplits) {
        SCOPED_TRACE(s.name);
        const Outcome seg = run(tiny_hybrid(), DType::f32, s.bounds, documents);
        EXPECT_NEAR(seg.loss, one.loss, 1e-5 * std::abs(one.loss));
        EXPECT_LE(mt::testing::rho(seg.grads, one.grads), 1e-5);
        expect_counted_once(seg, one);
    }
}

INSTANTIATE_TEST_SUITE_P(Documents, SegmentsModel, ::testing::Bool(), [](const auto& info) {
    return info.param ? std::string("documents") : std::string("one_document_per_row");
});

// long.offload_kv: the caches and accumulators in (pinned) host memory, staged one layer ahead: the same steps bit
// for bit (two, so that the first one's accumulator rows must not leak into the second), under every recompute
// policy (the forward re-runs read the staged keys).
TEST(SegmentsModelOffload, OffloadedCachesGiveTheSameStepBitForBit) {
    ModelConfig selective = tiny_hybrid();
    selective.recompute.policy = RecomputePolicy::selective;
    selective.recompute.modules = {RecomputeModule::attn_core, RecomputeModule::kda};
    ModelConfig full = tiny_hybrid();
    full.recompute.policy = RecomputePolicy::full;
    ModelConfig plain = full;
    plain.attnres.mode = AttnResMode::off;
    for (const ModelConfig& cfg : {tiny_hybrid(), selective, full, plain})
        for (const auto& bounds : {std::vector<int64_t>{37}, std::vector<int64_t>{5, 20, 32, 45, 64, 90}}) {
            const Outcome kept = run(cfg, DType::f64, bounds, true, false, 2);
            const Outcome offloaded = run(cfg, DType::f64, bounds, true, true, 2);
            EXPECT_EQ(offloaded.loss, kept.loss);
            EXPECT_EQ(max_abs_diff(offloaded.grads, kept.grads), 0.0);
            expect_counted_once(offloaded, kept);
        }
}

// One row: the caches and the segment's inputs are views of the sequence's rows rather than copies.
TEST(SegmentsModelOneRow, SegmentsEqualOnePass) {
    for (bool offload : {false, true}) {
        const Outcome one = run(tiny_hybrid(), DType::f64, {}, true, false, 1, 1);
        const Outcome seg = run(tiny_hybrid(), DType::f64, {5, 20, 32, 45, 64, 90}, true, offload, 2, 1);
        EXPECT_NEAR(seg.loss, one.loss, 1e-12 * std::abs(one.loss));
        EXPECT_LE(mt::testing::rho(seg.grads, one.grads), 1e-12);
        expect_counted_once(seg, run(tiny_hybrid(), DType::f64, {}, true, false, 2, 1));
    }
}

// Recompute policies inside each segment: selective (KDA, attention core, norms, MoE) and full.
TEST(SegmentsModelRecompute, SegmentsEqualOnePassUnderRecompute) {
    ModelConfig selective = tiny_hybrid();
    selective.recompute.policy = RecomputePolicy::selective;
    selective.recompute.modules = {
        RecomputeModule::kda, RecomputeModule::attn_core, RecomputeModule::norm, RecomputeModule::moe_experts};
    ModelConfig full = tiny_hybrid();
    full.recompute.policy = RecomputePolicy::full;
    ModelConfig full_plain = full;  // recompute full over the plain residual stream (groups of blocks)
    full_plain.attnres.mode = AttnResMode::off;
    for (const ModelConfig& cfg : {selective, full, full_plain}) {
        const Outcome one = run(tiny_hybrid(), DType::f64, {}, true);
        const Outcome ref = run(cfg, DType::f64, {}, true);
        const Outcome seg = run(cfg, DType::f64, {20, 45, 64}, true);
        EXPECT_NEAR(seg.loss, ref.loss, 1e-12 * std::abs(ref.loss));
        EXPECT_LE(mt::testing::rho(seg.grads, ref.grads), 1e-12);
        expect_counted_once(seg, ref);
        if (cfg.attnres.enabled()) {
            EXPECT_LE(mt::testing::rho(ref.grads, one.grads), 1e-12);
        }
    }
}

// Without the carried caches a segment would see only itself: the test above would fail. Check that it can.
TEST(SegmentsModelSensitivity, SegmentsThatForgetDiffer) {
    ModelConfig cfg = tiny_hybrid();
    const Outcome one = run(cfg, DType::f64, {}, false);
    // Document masking with an EOT at every segment's last token makes each segment its own document: the same
    // cut with no carried context. Its gradients must differ from the one pass over the unbroken sequence.
    cfg.document_mask = true;
    Model model(cfg, Precision::cpu(DType::f64));
    model.params().initialize(7);
    model.params().zero_grads();
    Batch b = make_batch(false);
    for (int64_t r = 0; r < kB; ++r) core::tensor_set_flat(b.ids, r * kT + 36, kEot);
    model.forward(b.ids, b.targets);
    model.backward(1.0);
    EXPECT_GT(mt::testing::rho(model.params().grad_arena().to(DType::f64), one.grads), 1e-6);
}

// long/max_logit (long_context.md §9), one layer: the largest pre-softmax logit of the forward equals the maximum of
// q.k / sqrt(D) over every causal pair of the layer's saved (rotated) q and k, with GQA's head groups; -inf with
// tracking off.
TEST(AttentionMaxLogit, TheLayerRecordsItsLargestCausalLogit) {
    ModelConfig cfg = tiny_hybrid();
    cfg.attn_pos = "rope";
    const Precision p = Precision::cpu(DType::f64);
    ParamTable table;
    AttentionLayer layer(table, "attn", cfg);
    table.finalize(p);
    table.initialize(5);
    const int64_t b = 2, t = 19, d = cfg.resolved_head_dim(), group = cfg.n_heads / cfg.n_kv_heads;
    layer.resize(b, t, p);
    const Tensor x = Tensor::zeros({b * t, cfg.d_model}, DType::f64),
                 out = Tensor::zeros({b * t, cfg.d_model}, DType::f64);
    for (int64_t i = 0; i < x.numel(); ++i) core::tensor_set_flat(x, i, core::rng_normal(2, 0, i));
    layer.forward(x, out);
    layer.collect_max_logit();
    EXPECT_EQ(layer.max_logit(), -INFINITY) << "tracking off";
    layer.set_track_max_logit(true);
    layer.forward(x, out);
    layer.collect_max_logit();  // the row maxima stay on the device until collected (the model does it per pass)
    const std::vector<SavedTensor> saved = layer.saved_for_backward();
    const Tensor& q = *saved[0].tensor;  // [B, T, Hq, D]
    const Tensor& k = *saved[1].tensor;  // [B, T, Hkv, D]
    double expected = -INFINITY;
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < cfg.n_heads; ++h)
            for (int64_t i = 0; i < t; ++i)
                for (int64_t j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < d; ++e) dot += q.at({bb, i, h, e}) * k.at({bb, j, h / group, e});
                    expected = std::max(expected, dot / std::sqrt(static_cast<double>(d)));
                }
    EXPECT_NEAR(layer.max_logit(), expected, 1e-12 * std::abs(expected));
}

// Through the model: one value per attention layer, the same under segments (each segment's queries and the cached
// keys they see), reset by each forward.
TEST(AttentionMaxLogit, SegmentsRecordTheOnePassMaximum) {
    std::vector<double> one_pass;
    for (const std::vector<int64_t>& bounds : {std::vector<int64_t>{}, std::vector<int64_t>{37, 64}}) {
        ModelConfig cfg = tiny_hybrid();
        cfg.segments.bounds = bounds;
        Model model(cfg, Precision::cpu(DType::f64));
        model.params().initialize(7);
        model.set_track_max_logit(true);
        const Batch batch = make_batch(true);
        model.forward(batch.ids, batch.targets);
        const auto logits = model.attention_max_logits();
        ASSERT_EQ(logits.size(), 2u);  // KAKA: layers 1 and 3 (block index)
        EXPECT_EQ(logits[0].first, 1);
        for (size_t i = 0; i < logits.size(); ++i) {
            EXPECT_TRUE(std::isfinite(logits[i].second));
            if (bounds.empty())
                one_pass.push_back(logits[i].second);
            else
                EXPECT_NEAR(logits[i].second, one_pass[i], 1e-12 * std::abs(one_pass[i]));
        }
    }
}

TEST(SegmentBounds, CountTokensAndExplicit) {
    SegmentConfig c;
    c.tokens = 64;
    EXPECT_EQ(segment_bounds(c, 200, 64, 1.0, 0.0), (std::vector<int64_t>{0, 64, 128, 192, 200}));
    c = {};
    c.count = 4;  // linear cost only: equal chunk-multiple parts
    EXPECT_EQ(segment_bounds(c, 256, 64, 1.0, 0.0), (std::vector<int64_t>{0, 64, 128, 192, 256}));
    // Attention-dominated cost t^2: the cuts sit at sqrt(j / J) of the length, later segments shorter.
    const std::vector<int64_t> q = segment_bounds(c, 4096, 64, 0.0, 1.0);
    EXPECT_EQ(q, (std::vector<int64_t>{0, 2048, 2880, 3520, 4096}));
    // A sequence too short for J chunk-multiple parts gets fewer.
    EXPECT_EQ(segment_bounds(c, 100, 64, 1.0, 0.0), (std::vector<int64_t>{0, 64, 100}));
    c = {};
    c.bounds = {5, 40};
    EXPECT_EQ(segment_bounds(c, 50, 64, 1.0, 0.0), (std::vector<int64_t>{0, 5, 40, 50}));
}

TEST(SegmentsModelConfig, CountPicksBoundariesAndEqualsOnePass) {
    ModelConfig cfg = tiny_hybrid();
    const Outcome one = run(cfg, DType::f64, {}, false);
    cfg.segments.count = 3;
    const Outcome seg = run(cfg, DType::f64, {}, false);
    EXPECT_EQ(seg.bounds, (std::vector<int64_t>{0, 32, 64, kT}));  // chunk multiples, balanced by cost
    EXPECT_NEAR(seg.loss, one.loss, 1e-12 * std::abs(one.loss));
    EXPECT_LE(mt::testing::rho(seg.grads, one.grads), 1e-12);
}

}  // namespace
}  // namespace mt::nn
