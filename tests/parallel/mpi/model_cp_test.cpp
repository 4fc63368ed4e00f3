// Context parallelism through the whole model under mpirun (long_context.md §7 and §10 test 6): the world is one cp
// group (cp = 2 and 4), every rank runs its zigzag share of the same batch, and the loss, every parameter gradient
// (each rank's part summed over the group) and the MoE routing counts equal one process's: f64 rho <= 1e-12, f32
// <= 1e-5, counts exactly; softmax attention all-gather and ring, KDA relay and affine. With document masking the
// batch has a document starting exactly at a chunk (span) start and one starting inside a span.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "parallel/comm.h"
#include "parallel/runtime.h"
#include "support/rho.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;
using parallel::dist_world;

constexpr int32_t kEot = 36;
constexpr int64_t kB = 2, kChunk = parallel::kCpGranule;

int64_t world() {
    return dist_world().size();
}
int64_t seq_len() {
    return parallel::cp_granularity(world());  // 2 cp chunks of 64
}

// Attention only (RoPE on: positions must be the global ones), with the sink logit, MoE and Block AttnRes.
ModelConfig tiny_attention() {
    ModelConfig c;
    c.vocab_size = 37;
    c.d_model = 16;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 512;
    c.init_std = 0.2;
    c.attn.sink_logit = true;
    c.loss_chunk_tokens = 96;  // head chunks that cut across the chunks of the zigzag
    c.eot_token = kEot;
    return c;
}

// The KDA/attention hybrid: KDA layers 1 and 3 (chunk 32, so a span holds several chunks), global attention 2 and 4
// (NoPE, as the hybrid default).
ModelConfig tiny_hybrid() {
    ModelConfig c = tiny_attention();
    c.n_layers = 4;
    c.layer_pattern = "KA";
    c.kda.num_heads = 2;
    c.kda.head_dim = 4;
    c.kda.chunk_size = 32;
    return c;
}

ModelConfig with_moe_attnres(ModelConfig c) {
    c.moe_enabled = true;
    c.moe_first_k_dense = 1;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 8;
    c.attnres.mode = AttnResMode::block;
    c.attnres.block_size = 2;
    return c;
}

struct Batch {
    Tensor ids, targets;
};

// Random tokens. With documents, row 0's EOTs at c - 1, c + 20 and 3 c - 1 start documents exactly at the first
// token of chunks 1 and 3 (span starts) and inside chunk 1 (inside a span); row 1's first document runs over chunks 0
// to 2 (several ranks) and the next starts inside chunk 2. Every seventh target is ignored.
Batch make_batch(bool documents, int64_t t_len = seq_len(), const std::vector<int64_t>& extra_eots = {}) {
    const int64_t c = seq_len() / (2 * world());
    Batch b{Tensor::zeros({kB, t_len}, DType::i32), Tensor::zeros({kB, t_len}, DType::i32)};
    for (int64_t r = 0; r < kB; ++r)
        for (int64_t t = 0; t < t_len; ++t) {
            auto id = static_cast<int32_t>(core::rng_u64(5, r, t) % kEot);
            bool eot = (r == 0 && (t == c - 1 || t == c + 20 || t == 3 * c - 1)) || (r == 1 && t == 2 * c + 5);
            for (int64_t e : extra_eots) eot = eot || (r == 0 && t == e);
            if (documents && eot) id = kEot;
            core::tensor_set_flat(b.ids, r * t_len + t, id);
            const double target =
                t % 7 == 3 ? kIgnoreIndex : static_cast<double>(core::rng_u64(5, 9, r * t_len + t) % 37);
            core::tensor_set_flat(b.targets, r * t_len + t, target);
        }
    return b;
}

struct Outcome {
    double loss = 0.0;
    Tensor grads;                             // f64, the whole model's (summed over the cp group)
    std::vector<std::vector<int64_t>> loads;  // per MoE layer, the step's per-expert loads (summed over the group)
    std::vector<std::string> names;           // parameter names, for messages
    std::vector<std::pair<int64_t, int64_t>> ranges;  // each parameter's [offset, offset + numel) in grads
};

// One forward and backward of the batch; cp = 1: one process (every rank runs the same), else the world as one cp
// group of the given modes.
// With segments: a row of t_len tokens cut at `bounds` (long.segments), extra_eots as make_batch's.
struct Segments {
    int64_t t_len = seq_len();
    std::vector<int64_t> bounds;
    std::vector<int64_t> extra_eots;
};

Outcome run(ModelConfig cfg,
            DType dtype,
            bool documents,
            int64_t cp,
            CpAttnMode attn,
            CpKdaMode kda,
            const Segments& segments = {}) {
    cfg.document_mask = documents;
    cfg.segments.bounds = segments.bounds;
    cfg.max_seq_len = std::max(cfg.max_seq_len, segments.t_len);
    auto self = parallel::comm_make_self();
    parallel::Comm& group = cp > 1 ? dist_world() : *self;
    const ContextParallel ctx{.size = cp, .rank = group.rank(), .attn = attn, .kda = kda, .comm = &group};
    Model model(cfg, Precision::cpu(dtype), 64, {}, {}, {}, ctx);
    model.params().initialize(7);
    model.params().zero_grads();
    const Batch batch = make_batch(documents, segments.t_len, segments.extra_eots);
    Outcome out;
    out.loss = model.forward(batch.ids, batch.targets);
    model.backward(1.0);
    out.grads = model.params().grad_arena().to(DType::f64);
    group.all_reduce(out.grads).wait();  // each rank's tokens' part of every gradient
    for (auto& [l, moe] : model.moe_layers()) out.loads.push_back(moe->step_end(0, &group).load);
    const ParamTable& table = model.params();
    for (int i = 0; i < table.size(); ++i) {
        out.names.push_back(table.spec(i).name);
        out.ranges.emplace_back(table.offset(i), table.offset(i) + table.grad(i).numel());
    }
    return out;
}

// The loss, the gradients (all of them as one vector; the worst tensor named when they miss) and the routing counts.
void expect_equal(const Outcome& cp, const Outcome& one, double tol, const std::string& what) {
    EXPECT_NEAR(cp.loss, one.loss, tol * std::abs(one.loss)) << what;
    const double all = mt::testing::rho(cp.grads, one.grads);
    EXPECT_LE(all, tol) << what;
    if (all > tol)
        for (size_t i = 0; i < one.names.size(); ++i) {
            const auto [lo, hi] = one.ranges[i];
            const double r = mt::testing::rho(cp.grads.slice(0, lo, hi), one.grads.slice(0, lo, hi));
            if (r > tol) ADD_FAILURE() << what << ": " << one.names[i] << " rho " << r;
        }
    EXPECT_EQ(cp.loads, one.loads) << what;
    if (dist_world().rank() == 0)
        fmt::print("{}: cp {} vs one process: loss {:.2e}, gradients rho {:.2e}\n",
                   what,
                   world(),
                   std::abs(cp.loss - one.loss) / std::abs(one.loss),
                   all);
}

// f32 only: a top-k near-tie of the router may go the other way under cp (its sums run in another order; which way
// depends even on the BLAS kernels OpenBLAS picked for the CPU), and one token routed to another expert moves every
// gradient by far more than rounding. Such a flip, at most one token per MoE layer, is accepted with the loss within
// 1e-4 (the f64 runs of the same case are the exactness check); anything else is compared as expect_equal does.
void expect_equal_f32(const Outcome& cp, const Outcome& one, double tol, const std::string& what) {
    bool flip = cp.loads != one.loads && cp.loads.size() == one.loads.size();
    for (size_t l = 0; flip && l < one.loads.size(); ++l) {
        int64_t moved = 0;
        for (size_t e = 0; e < one.loads[l].size() && e < cp.loads[l].size(); ++e)
            moved += std::abs(cp.loads[l][e] - one.loads[l][e]);
        flip = cp.loads[l].size() == one.loads[l].size() && moved <= 2;
    }
    if (!flip) return expect_equal(cp, one, tol, what);
    EXPECT_NEAR(cp.loss, one.loss, 1e-4 * std::abs(one.loss)) << what;
    if (dist_world().rank() == 0)
        fmt::print("{}: a routing near-tie flipped one token (f32); loss {:.2e}, gradients not compared\n",
                   what,
                   std::abs(cp.loss - one.loss) / std::abs(one.loss));
}

struct Case {
    const char* name;
    ModelConfig cfg;
    bool every_variant = true;  // false: f64 with documents only (recompute: what it reruns is already covered)
};

std::vector<Case> attention_cases() {
    ModelConfig rope = tiny_attention();
    rope.attn_pos = "rope";
    return {{"attention_rope", rope}, {"attention_moe_attnres", with_moe_attnres(tiny_attention())}};
}

// Each case under both softmax modes equals one process (f64 only for a case with every_variant off).
void expect_attention_modes_match(const std::vector<Case>& cases, bool documents) {
    for (const Case& c : cases)
        for (DType dtype : {DType::f64, DType::f32}) {
            if (!c.every_variant && dtype != DType::f64) continue;
            const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
            const std::string what =
                fmt::format("{} {} {}", c.name, documents ? "documents" : "rows", dtype_name(dtype));
            const Outcome one = run(c.cfg, dtype, documents, 1, CpAttnMode::allgather, CpKdaMode::affine);
            for (CpAttnMode mode : {CpAttnMode::allgather, CpAttnMode::ring}) {
                const Outcome cp = run(c.cfg, dtype, documents, world(), mode, CpKdaMode::affine);
                expect_equal(cp, one, tol, what + " " + enum_name(mode));
            }
        }
}

class ModelCpAttention : public ::testing::TestWithParam<bool> {};  // document masking off / on

// Softmax attention: all-gather and ring each equal one process.
TEST_P(ModelCpAttention, AllGatherAndRingEqualOneProcess) {
    expect_attention_modes_match(attention_cases(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Documents, ModelCpAttention, ::testing::Bool(), [](const auto& info) {
    return info.param ? std::string("documents") : std::string("one_document_per_row");
});

std::vector<Case> hybrid_cases() {
    ModelConfig selective = tiny_hybrid();
    selective.recompute.policy = RecomputePolicy::selective;
    selective.recompute.modules = {RecomputeModule::kda, RecomputeModule::attn_core, RecomputeModule::norm};
    ModelConfig full = tiny_hybrid();
    full.recompute.policy = RecomputePolicy::full;
    return {{"hybrid", tiny_hybrid()},
            {"hybrid_moe_attnres", with_moe_attnres(tiny_hybrid())},
            {"hybrid_recompute_selective", selective, false},
            {"hybrid_recompute_full", full, false}};
}

class ModelCpKda : public ::testing::TestWithParam<bool> {};  // document masking off / on

// KDA: relay (the oracle) and affine each equal one process, and each other.
TEST_P(ModelCpKda, AffineEqualsRelayEqualsOneProcess) {
    const bool documents = GetParam();
    for (const Case& c : hybrid_cases())
        for (DType dtype : {DType::f64, DType::f32}) {
            if (!c.every_variant && (dtype != DType::f64 || !documents)) continue;
            const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
            const std::string what =
                fmt::format("{} {} {}", c.name, documents ? "documents" : "rows", dtype_name(dtype));
            const Outcome one = run(c.cfg, dtype, documents, 1, CpAttnMode::allgather, CpKdaMode::relay);
            const Outcome relay = run(c.cfg, dtype, documents, world(), CpAttnMode::allgather, CpKdaMode::relay);
            const Outcome affine = run(c.cfg, dtype, documents, world(), CpAttnMode::allgather, CpKdaMode::affine);
            expect_equal(relay, one, tol, what + " relay");
            expect_equal(affine, one, tol, what + " affine");
            expect_equal(affine, relay, tol, what + " affine vs relay");
            if (c.name == std::string("hybrid_moe_attnres"))  // its attention layers under the ring too
                expect_equal(run(c.cfg, dtype, documents, world(), CpAttnMode::ring, CpKdaMode::affine),
                             one,
                             tol,
                             what + " ring affine");
        }
}

INSTANTIATE_TEST_SUITE_P(Documents, ModelCpKda, ::testing::Bool(), [](const auto& info) {
    return info.param ? std::string("documents") : std::string("one_document_per_row");
});

// Sliding-window layers (window + global tokens + their own RoPE base): each span's w - 1 rows before it come from the
// ranks that hold them. w = 20 reaches into the chunk before; w = 150 over two or three chunks (64 tokens each) of
// other ranks. `window_layers` are 1-based layer numbers.
ModelConfig with_window(ModelConfig c, int64_t window, std::vector<int64_t> window_layers) {
    c.attn.window = window;
    c.attn.window_layers = std::move(window_layers);
    c.attn.global_tokens = 2;
    c.attn.window_rope_base = 10000.0;
    return c;
}

class ModelCpWindow : public ::testing::TestWithParam<bool> {};  // document masking off / on

TEST_P(ModelCpWindow, HaloWindowsEqualOneProcess) {
    expect_attention_modes_match(
        {{"attention_window20", with_window(tiny_attention(), 20, {1})},
         {"attention_window150", with_window(tiny_attention(), 150, {1, 2})},
         {"hybrid_moe_attnres_window150", with_window(with_moe_attnres(tiny_hybrid()), 150, {2}), false}},
        GetParam());
}

INSTANTIATE_TEST_SUITE_P(Documents, ModelCpWindow, ::testing::Bool(), [](const auto& info) {
    return info.param ? std::string("documents") : std::string("one_document_per_row");
});

// Context parallelism with sequence segments (long_context.md §4 and §7): each segment zigzagged over the group on
// its own, the attention caches holding the earlier segments' keys, KDA's state and conv halo carried from segment to
// segment on the ranks that hold them. Three segments of 2 cp chunks of 64 (equal), and two uneven ones, against one
// process without segments; with documents one starts exactly at a segment start (EOT at g - 1), one at a span start
// inside a segment and one inside a span, and row 1's first document runs over the first two segments.
class ModelCpSegments : public ::testing::TestWithParam<bool> {};  // document masking off / on

TEST_P(ModelCpSegments, SegmentsUnderCpEqualOneProcessWithout) {
    const bool documents = GetParam();
    const int64_t g = seq_len();  // 2 cp x 64
    const std::vector<int64_t> eots = {g - 1, g + 63, g + 64 + 20, 2 * g - 1 + 64};
    const ModelConfig window = with_window(with_moe_attnres(tiny_hybrid()), 150, {2});
    ModelConfig recompute = window;
    recompute.recompute.policy = RecomputePolicy::selective;
    recompute.recompute.modules = {RecomputeModule::kda, RecomputeModule::attn_core};
    struct SegCase {
        const char* name;
        ModelConfig cfg;
        Segments seg;
        bool every_variant;                 // false: f64, documents, one KDA mode
        CpKdaMode kda = CpKdaMode::affine;  // that mode
    };
    const std::vector<SegCase> cases = {
        {"hybrid_moe_attnres_window150 J=3", window, {3 * g, {g, 2 * g}, eots}, true},
        {"hybrid_moe_attnres_window150 J=2 uneven", window, {3 * g, {2 * g}, eots}, false},
        {"hybrid_moe_attnres_window150 J=2 uneven relay", window, {3 * g, {2 * g}, eots}, false, CpKdaMode::relay},
        {"hybrid_recompute J=3", recompute, {3 * g, {g, 2 * g}, eots}, false},
        {"attention_rope J=2",
         [] {
             ModelConfig c = tiny_attention();
             c.attn_pos = "rope";
             return c;
         }(),
         {2 * g, {g}, eots},
         false}};
    // Without documents only the first case (the rest add uneven cuts, recompute and RoPE, whose positions the
    // documents restart). Under segments the ring runs the all-gather's code (cp_attention.h): checked once.
    for (const SegCase& c : cases)
        for (DType dtype : {DType::f64, DType::f32}) {
            if ((!c.every_variant && (dtype != DType::f64 || !documents))) continue;
            const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
            const std::string what =
                fmt::format("{} {} {}", c.name, documents ? "documents" : "rows", dtype_name(dtype));
            const Segments whole{.t_len = c.seg.t_len, .bounds = {}, .extra_eots = c.seg.extra_eots};
            const Outcome one = run(c.cfg, dtype, documents, 1, CpAttnMode::allgather, CpKdaMode::relay, whole);
            for (CpKdaMode kda : {CpKdaMode::affine, CpKdaMode::relay}) {
                if (!c.every_variant && kda != c.kda) continue;
                const Outcome cp = run(c.cfg, dtype, documents, world(), CpAttnMode::allgather, kda, c.seg);
                const std::string variant = fmt::format("{} allgather {}", what, enum_name(kda));
                if (dtype == DType::f32)
                    expect_equal_f32(cp, one, tol, variant);
                else
                    expect_equal(cp, one, tol, variant);
            }
            if (c.every_variant && dtype == DType::f64)
                expect_equal(run(c.cfg, dtype, documents, world(), CpAttnMode::ring, CpKdaMode::affine, c.seg),
                             one,
                             tol,
                             what + " ring affine");
        }
}

INSTANTIATE_TEST_SUITE_P(Documents, ModelCpSegments, ::testing::Bool(), [](const auto& info) {
    return info.param ? std::string("documents") : std::string("one_document_per_row");
});

// The sequence's final KDA state (long/kda_state_rms reads it on rank 0, which holds the last chunk) is one process's
// under both modes.
TEST(ModelCpKdaState, FinalStateIsTheSequences) {
    ModelConfig cfg = tiny_hybrid();
    cfg.document_mask = true;
    const Batch batch = make_batch(true);
    auto final_states = [&](int64_t cp, CpKdaMode mode) {
        auto self = parallel::comm_make_self();
        parallel::Comm& group = cp > 1 ? dist_world() : *self;
        const ContextParallel ctx{.size = cp, .rank = group.rank(), .kda = mode, .comm = &group};
        Model model(cfg, Precision::cpu(DType::f64), 64, {}, {}, {}, ctx);
        model.params().initialize(7);
        model.forward(batch.ids, batch.targets, /*training=*/false);
        std::vector<Tensor> out;
        for (auto& [layer, st] : model.kda_final_states()) out.push_back(st.clone());
        return out;
    };
    const std::vector<Tensor> one = final_states(1, CpKdaMode::relay);
    ASSERT_EQ(one.size(), 2u);
    for (CpKdaMode mode : {CpKdaMode::relay, CpKdaMode::affine}) {
        const std::vector<Tensor> cp = final_states(world(), mode);
        ASSERT_EQ(cp.size(), one.size());
        if (mode != CpKdaMode::affine && dist_world().rank() != 0) continue;  // relay: rank 0 ends the sequence
        for (size_t l = 0; l < one.size(); ++l) {
            EXPECT_LE(mt::testing::rho(cp[l], one[l]), 1e-12) << enum_name(mode);
        }
    }
}

// Without the other ranks' keys (each rank's queries attending to its own chunks alone) the gradients differ: the
// comparison above can fail. Documents ending at every chunk's last token cut the same attention.
TEST(ModelCpSensitivity, ChunksThatForgetTheirPrefixDiffer) {
    ModelConfig cfg = tiny_attention();
    const Outcome whole = run(cfg, DType::f64, false, 1, CpAttnMode::allgather, CpKdaMode::affine);
    cfg.document_mask = true;
    auto self = parallel::comm_make_self();
    Model model(cfg, Precision::cpu(DType::f64));
    model.params().initialize(7);
    model.params().zero_grads();
    Batch b = make_batch(false);
    for (int64_t r = 0; r < kB; ++r)
        for (int64_t t = kChunk - 1; t < seq_len(); t += kChunk) core::tensor_set_flat(b.ids, r * seq_len() + t, kEot);
    model.forward(b.ids, b.targets);
    model.backward(1.0);
    EXPECT_GT(mt::testing::rho(model.params().grad_arena().to(DType::f64), whole.grads), 1e-6);
}

// The zigzag row moves between ranks: a gather puts every rank's rows in their places, a reduce-scatter hands each
// rank the sum of its rows.
TEST(ModelCpRows, GatherAndReduceScatterFollowTheZigzag) {
    const ContextParallel cp{.size = world(), .rank = dist_world().rank(), .comm = &dist_world()};
    const int64_t t_len = 4 * world();
    const Tensor whole = Tensor::zeros({2, t_len, 3}, DType::f64);
    for (int64_t i = 0; i < whole.numel(); ++i) core::tensor_set_flat(whole, i, static_cast<double>(i));
    const Tensor local = cp_local(cp, whole);
    const parallel::Zigzag z = cp.layout(t_len);
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < z.local(); ++i) EXPECT_EQ(local.at({b, i, 1}), whole.at({b, z.position(i), 1}));
    const Tensor back = Tensor::zeros(whole.shape(), DType::f64);
    cp_gather_rows(cp, local, back);
    EXPECT_EQ(mt::testing::rho(back, whole), 0.0);
    const Tensor sum = Tensor::zeros(local.shape(), DType::f64);
    cp_reduce_scatter_rows(cp, whole, sum);  // every rank holds `whole`: the sum is world() times the rows
    for (int64_t i = 0; i < sum.numel(); ++i)
        EXPECT_EQ(core::tensor_get_flat(sum, i), static_cast<double>(world()) * core::tensor_get_flat(local, i));
}

}  // namespace
}  // namespace mt::nn
