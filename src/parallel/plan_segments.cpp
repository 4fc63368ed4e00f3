// Sequence segments in the memory plan: the boundaries (Model::plan_segments' rule), the buffers that cross them
// (nn/layers/segment_kv.cpp, kda_layer.cpp, nn/model.cpp) and one segment's activations.
#include "parallel/plan_segments.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "nn/model.h"
#include "nn/segments.h"

namespace mt::parallel {

namespace {

using core::DType;

int64_t size_of(DType dtype) {
    return static_cast<int64_t>(core::dtype_size(dtype));
}

// Model::flops_per_token(seq) from the laid-out table (a real Model would allocate its arenas): every 2-D weight
// but the input embedding [V, C] once per token (the tied head counts it again), top_k routed experts, a window
// layer's global tokens not, then causal attention, window attention and the KDA recurrences.
double plan_flops_per_token(const nn::ModelConfig& cfg, int64_t seq) {
    const nn::ParamTable table = nn::Model::param_layout(cfg, nn::Precision::cpu(DType::f32));
    double matmul = 0.0;
    for (int i = 0; i < table.size(); ++i)
        if (table.spec(i).shape.size() == 2) matmul += static_cast<double>(core::shape_numel(table.spec(i).shape));
    if (!cfg.tie_embeddings) matmul -= static_cast<double>(cfg.vocab_size * cfg.d_model);
    matmul += static_cast<double>(cfg.n_moe_layers() * cfg.moe.top_k * 3 * cfg.moe.expert_ffn_dim * cfg.d_model);
    const int64_t n_window = cfg.n_window_layers(), n_kda = cfg.n_kda_layers(),
                  n_attn = cfg.n_layers - n_kda - n_window;
    matmul -= static_cast<double>(n_window * cfg.attn.global_tokens * cfg.d_model);
    const double hd = static_cast<double>(cfg.n_heads * cfg.resolved_head_dim());
    const double attn = 6.0 * static_cast<double>(n_attn * seq) * hd;
    const double w = static_cast<double>(std::min(cfg.attn.window, seq)), t = static_cast<double>(seq);
    const double window_keys =
        w * (w + 1.0) / (2.0 * t) + (t - w) * w / t + static_cast<double>(cfg.attn.global_tokens);
    const double window = 12.0 * static_cast<double>(n_window) * window_keys * hd;
    return 6.0 * matmul + attn + window + static_cast<double>(n_kda) * nn::kda_flops_per_token(cfg, seq);
}

}  // namespace

int64_t PlanSegments::longest() const {
    int64_t s = 0;
    for (int64_t j = 0; j < count(); ++j) s = std::max(s, length(j));
    return s;
}

std::vector<int64_t> plan_segment_bounds(const nn::ModelConfig& cfg, int64_t seq) {
    if (!cfg.segments.enabled()) return {0, seq};
    // Only the balanced split (long.segments) weighs the positions: a token at t costs linear + per_key t.
    double linear = 0.0, per_key = 0.0;
    if (cfg.segments.bounds.empty() && cfg.segments.tokens <= 0) {
        const int64_t n_attn = cfg.n_layers - cfg.n_kda_layers() - cfg.n_window_layers();
        per_key = 12.0 * static_cast<double>(n_attn * cfg.n_heads * cfg.resolved_head_dim());
        linear = plan_flops_per_token(cfg, seq) - per_key * 0.5 * static_cast<double>(seq);
    }
    return nn::segment_bounds(cfg.segments, seq, cfg.n_kda_layers() > 0 ? cfg.kda.chunk_size : 64, linear, per_key);
}

PlanSegments plan_segments(const nn::ModelConfig& cfg, const nn::Precision& precision, int64_t batch, int64_t seq) {
    PlanSegments out;
    out.bounds = plan_segment_bounds(cfg, seq);
    out.offload = cfg.segments.offload_kv;
    const int64_t segs = out.count();
    if (segs <= 1) return out;
    const bool cuda = precision.device == core::Device::cuda, off = out.offload;
    const int64_t a = size_of(precision.compute), s = size_of(precision.stats);
    const SegmentWhere kept = off ? SegmentWhere::pinned : SegmentWhere::device;
    auto add = [&](std::string name, PlanKind kind, int64_t each, int64_t count, SegmentWhere where, bool bwd = false) {
        if (count > 0 && each > 0) out.held.push_back({std::move(name), kind, each, count, where, bwd});
    };
    // SegmentKv::begin: K, V and the accumulators dK, dV of the whole row, [B, T, Hkv, D] each, per global attention
    // layer.
    const int64_t hkvd = cfg.n_kv_heads * cfg.resolved_head_dim(), n_window = cfg.n_window_layers();
    const int64_t n_global = cfg.n_layers - cfg.n_kda_layers() - n_window, kv = batch * seq * hkvd * a;
    add("attention.kv_cache", PlanKind::attention, kv, 2 * n_global, kept);
    add("attention.kv_grads", PlanKind::attention, kv, 2 * n_global, kept);
    // WindowKv: per segment after the first, a window layer's snapshot of the K, V rows [lo, first) before it (at
    // most w - 1), kept from the forward of the segment before; with offload on a GPU the running segment's copy on
    // the device; in the backward, the gradient rows it passes to the segment before (backward_grads' pending).
    if (n_window > 0) {
        std::map<int64_t, int64_t> snapshots;  // rows -> segments
        int64_t widest = 0;
        for (int64_t j = 1; j < segs; ++j) {
            const int64_t rows = std::min(out.first(j), cfg.attn.window - 1);
            snapshots[rows] += 1;
            widest = std::max(widest, rows);
        }
        for (const auto& [rows, count] : snapshots)
            add(fmt::format("attention.window_snapshots_{}", rows),
                PlanKind::attention,
                batch * rows * hkvd * a,
                2 * count * n_window,
                kept);
        const int64_t widest_bytes = batch * widest * hkvd * a;
        add("attention.window_snapshot_copies",
            PlanKind::attention,
            widest_bytes,
            off && cuda ? 2 * n_window : 0,
            SegmentWhere::device);
        add("attention.window_grads", PlanKind::attention, widest_bytes, 2 * n_window, SegmentWhere::device, true);
    }
    // KdaLayer: the start state of every segment after the first (its first forward's S_T, kept for the re-run) and
    // its three convs' halos [B, W - 1, C] (q and k: H K channels, v: HV V), offloaded with the caches. On the
    // device besides: the whole row's final state, the state gradient passed back to the segment before and, in the
    // backward of the segments after the first, dS_0; with offload also the device original of the last kept state
    // and halos (next_s0_, next_halo_) and, on a GPU, the running segment's copies of them (cur_s0_, cur_halo_).
    const int64_t n_kda = cfg.n_kda_layers();
    const int64_t hv = cfg.kda_num_v_heads(), k = cfg.kda_head_dim(), v = cfg.kda_head_v_dim();
    const int64_t state = batch * hv * k * v * s, w1 = cfg.kda.conv_size - 1;
    const int64_t copies = off ? (cuda ? 2 : 1) : 0;  // device copies beside the host ones
    add("kda.kept_states", PlanKind::kda, state, (segs - 1) * n_kda, kept);
    add("kda.carried_states", PlanKind::kda, state, (2 + copies) * n_kda, SegmentWhere::device);
    add("kda.ds0", PlanKind::kda, state, n_kda, SegmentWhere::device, true);
    const int64_t halo_qk = batch * w1 * cfg.kda_num_heads() * k * a, halo_v = batch * w1 * hv * v * a;
    add("kda.kept_halos_qk", PlanKind::kda, halo_qk, 2 * (segs - 1) * n_kda, kept);
    add("kda.kept_halos_v", PlanKind::kda, halo_v, (segs - 1) * n_kda, kept);
    add("kda.carried_halos_qk", PlanKind::kda, halo_qk, 2 * copies * n_kda, SegmentWhere::device);
    add("kda.carried_halos_v", PlanKind::kda, halo_v, copies * n_kda, SegmentWhere::device);
    // Model::forward: the whole row's per-token losses (last_token_losses), [B T] in the statistics dtype.
    add("losses", PlanKind::embed_head, batch * seq * s, 1, SegmentWhere::host);
    return out;
}

std::vector<int64_t> plan_segment_key_rows(const nn::ModelConfig& cfg, const PlanSegments& segments, int64_t j) {
    const int64_t first = segments.first(j), end = first + segments.length(j);
    std::vector<int64_t> rows(static_cast<size_t>(cfg.n_layers), 0);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
        if (cfg.layer_is_kda(l)) continue;
        // AttentionLayer::key_lo, WindowKv::lo: a window layer's queries see the w - 1 positions before the segment.
        const int64_t lo = cfg.layer_is_window(l) ? std::max<int64_t>(0, first - (cfg.attn.window - 1)) : 0;
        rows[static_cast<size_t>(l)] = end - lo;
    }
    return rows;
}

PlanActivations plan_segment_activations(const nn::ModelConfig& cfg,
                                         const nn::Precision& precision,
                                         int64_t batch,
                                         const PlanSegments& segments,
                                         int64_t j,
                                         int64_t ep_size,
                                         bool deterministic) {
    const int64_t len = segments.length(j), longest = segments.longest();
    PlanActivations a = plan_activations(cfg, precision, batch, len, ep_size, deterministic);
    if (segments.count() <= 1) return a;
    if (len != longest) {  // Workspace::reserve_slot keeps each slot at its largest reservation
        const PlanActivations big = plan_activations(cfg, precision, batch, longest, ep_size, deterministic);
        for (PlanBuffer& ws : a.workspace)
            for (const PlanBuffer& b : big.workspace)
                if (ws.name.starts_with("ws.slot") && b.name == ws.name) ws.bytes = b.bytes;
    }
    const int64_t w1 = cfg.kda.conv_size - 1;
    if (j == 0 || w1 <= 0) return a;
    // KdaLayer::conv_forward / conv_backward after the first segment: each conv runs over [B, W - 1 + len, C] with
    // the halo rows first (forward: the input and output; backward: the input, dy and dx, then the halo's gradient
    // [B, W - 1, C] beside the earlier convs' and, before the last segment, the later segment's three).
    const int64_t ae = size_of(precision.compute);
    const int64_t chans[3] = {cfg.kda_num_heads() * cfg.kda_head_dim(),
                              cfg.kda_num_heads() * cfg.kda_head_dim(),
                              cfg.kda_num_v_heads() * cfg.kda_head_v_dim()};
    const int64_t ext = batch * (w1 + len) * ae, halo = batch * w1 * ae;
    const int64_t pending = j + 1 < segments.count() ? halo * (chans[0] + chans[1] + chans[2]) : 0;
    int64_t fwd = 0, bwd = 0, dhalo = 0;
    for (int64_t c : chans) {
        dhalo += halo * c;
        fwd = std::max(fwd, 2 * ext * c);
        bwd = std::max(bwd, 3 * ext * c + dhalo + pending);
    }
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
        if (!cfg.layer_is_kda(l)) continue;
        PlanSubLayer& sub = a.blocks[static_cast<size_t>(l)].sub[0];
        if (fwd > sub.fwd_scratch) sub.fwd_scratch = fwd, sub.fwd_scratch_op = "causal_conv1d over the halo";
        if (bwd > sub.bwd_scratch) sub.bwd_scratch = bwd, sub.bwd_scratch_op = "causal_conv1d over the halo";
    }
    return a;
}

}  // namespace mt::parallel
