// Attention layer forward and backward, side by side.
#include "nn/layers/attention_layer.h"

#include <cmath>
#include <tuple>

#include "ops/add.h"
#include "ops/attention.h"
#include "ops/attention_global.h"
#include "ops/rope.h"

namespace mt::nn {

AttentionLayer::AttentionLayer(ParamTable& table,
                               const std::string& prefix,
                               const ModelConfig& cfg,
                               bool window,
                               const TensorParallel& tp,
                               const ContextParallel& cp)
    : cfg_(cfg), window_(window), table_(&table), cp_(cp, window ? cfg.attn.window : 0) {
    using Split = Linear::Split;
    const int64_t d = cfg.resolved_head_dim();
    // Heads are contiguous in the projections' outputs, so a rank's heads are a block of rows of Wq, Wk and Wv and
    // of columns of Wo.
    wq_ = Linear(table, prefix + ".wq", cfg.d_model, cfg.n_heads * d, cfg.init_std, tp, Split::column, 1, d);
    // With fewer key/value heads than tp ranks each kv head is replicated on tp / n_kv_heads ranks (vLLM's rule):
    // rank r's query heads are exactly those of kv head r / (tp / n_kv_heads).
    const int64_t hkv = cfg.n_kv_heads;
    wk_ = Linear(table, prefix + ".wk", cfg.d_model, hkv * d, cfg.init_std, tp, Split::kv_column, hkv, d);
    wv_ = Linear(table, prefix + ".wv", cfg.d_model, hkv * d, cfg.init_std, tp, Split::kv_column, hkv, d);
    // GPT-2 style scaled init for projections that write into the residual stream.
    wo_ = Linear(table,
                 prefix + ".wo",
                 cfg.n_heads * d,
                 cfg.d_model,
                 cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers)),
                 tp,
                 Split::row);
    cfg_.head_dim = d;  // fixed before the head counts become this rank's (d_model / n_heads would change)
    cfg_.n_heads = tp.shard(cfg.n_heads);
    cfg_.n_kv_heads = tp.size > cfg.n_kv_heads ? 1 : tp.shard(cfg.n_kv_heads);
    head_max_logit_.assign(static_cast<size_t>(cfg_.n_heads), -std::numeric_limits<double>::infinity());
    // The memory tokens are embeddings (no weight decay, as the token embedding's rows would be), the sink logits
    // start at 0 (e^0 = one extra unit of mass in every denominator).
    if (window && cfg.attn.global_tokens > 0)
        mem_ = table.add(tp_partial({.name = prefix + ".global_tokens",
                                     .shape = {cfg.attn.global_tokens, cfg.d_model},
                                     .init_std = cfg.init_std,
                                     .weight_decay = false},
                                    tp));
    if (cfg.attn.sink_logit)
        sink_ = table.add(tp_split(
            {.name = prefix + ".sink", .shape = {cfg.n_heads}, .init = InitKind::zeros, .weight_decay = false}, tp, 0));
}

void AttentionLayer::resize(int64_t batch, int64_t seq, const Precision& precision) {
    if (batch == batch_ && seq == seq_ && (q_.defined() || !dropped_.empty())) return;
    batch_ = batch;
    seq_ = seq;
    const int64_t d = cfg_.resolved_head_dim();
    const core::DType dtype = precision.compute;
    const core::Device dev = precision.device;
    act_dtype_ = dtype;
    device_ = dev;
    q_ = Tensor::zeros({batch, seq, cfg_.n_heads, d}, dtype, dev);
    k_ = Tensor::zeros({batch, seq, cfg_.n_kv_heads, d}, dtype, dev);
    v_ = Tensor::zeros({batch, seq, cfg_.n_kv_heads, d}, dtype, dev);
    attn_ = Tensor::zeros({batch, seq, cfg_.n_heads, d}, dtype, dev);
    lse_ = Tensor::zeros({batch, cfg_.n_heads, seq}, precision.stats, dev);
    lse_dtype_ = precision.stats;
    if (mem_ >= 0) {
        kg_ = Tensor::zeros({cfg_.attn.global_tokens, cfg_.n_kv_heads, d}, dtype, dev);
        vg_ = Tensor::zeros({cfg_.attn.global_tokens, cfg_.n_kv_heads, d}, dtype, dev);
    }
    dropped_.clear();
    if (cfg_.recompute.drops(RecomputeModule::attn_core))
        for (Tensor* t : {&q_, &k_, &v_, &attn_, &lse_}) dropped_.add(t);
    dropped_.release();  // allocated in the forward that needs them, so that no two layers hold them at once
}

void AttentionLayer::set_segment(const SegmentContext& seg) {
    seg_ = seg;
    if (!seg.active()) {
        kv_.clear();
        wkv_.clear();
        key_doc_start_ = Tensor();
        return;
    }
    MT_CHECK(seg.length == seq_ * cp_.ranks(),
             "attention segment of {} tokens on a layer sized for {} over {} cp ranks",
             seg.length,
             seq_,
             cp_.ranks());
    const int64_t d = cfg_.resolved_head_dim();
    if (window_) {
        wkv_.configure(cfg_.n_kv_heads, d, act_dtype_, device_, cfg_.segments.offload_kv, cfg_.attn.window);
        wkv_.begin(seg, batch_);
    } else {
        kv_.configure(cfg_.n_kv_heads, d, act_dtype_, device_, cfg_.segments.offload_kv);
        kv_.begin(seg, batch_, key_lo());
    }
    key_doc_start_ = seg.host_doc_start.defined()
                         ? doc_map_from(seg.host_doc_start, key_lo(), seg.first + seg.length, device_)
                         : Tensor();
}

void AttentionLayer::forward(const Tensor& x, const Tensor& out) {
    const int64_t n = batch_ * seq_;
    dropped_.restore();
    record_max_logit_ = track_max_logit_ && !seg_.recompute;
    // Under graphs kept in place from pass to pass (collect_max_logit's keep_buffer): a replay writes the buffer its
    // capture saw.
    if (record_max_logit_ && (!row_max_logit_.defined() || row_max_logit_.shape() != lse_shape()))
        row_max_logit_ = Tensor::scratch(lse_shape(), lse_dtype_, device_);
    forward_core(x);
    if (seg_.active() && !window_) kv_.forward_done();
    max_logit_written_ = record_max_logit_;
    record_max_logit_ = false;  // a recompute's re-run of forward_core leaves the row maxima alone
    wo_.forward(attn_.reshape({n, attn_.numel() / n}), out);
    dropped_.release();
}

void AttentionLayer::collect_max_logit(bool keep_buffer) {
    if (!max_logit_written_) return;
    max_logit_written_ = false;
    const Tensor rows = row_max_logit_.on_host().to(core::DType::f64);  // [B, Hq, T]
    const double* m = rows.data<double>();
    const int64_t b = rows.size(0), hq = rows.size(1), t = rows.size(2);
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < hq; ++h) {
            double& head = head_max_logit_[static_cast<size_t>(h)];
            for (int64_t i = 0; i < t; ++i) head = std::max(head, m[(bb * hq + h) * t + i]);
        }
    if (cp_.active()) cp_.max_over_group(head_max_logit_);  // the other ranks' queries, head by head
    for (double head : head_max_logit_) max_logit_ = std::max(max_logit_, head);
    if (!keep_buffer) row_max_logit_ = Tensor();
}

void AttentionLayer::forward_core(const Tensor& x) {
    const int64_t n = batch_ * seq_;
    wq_.forward(x, q_.reshape({n, q_.numel() / n}));
    wk_.forward(x, k_.reshape({n, k_.numel() / n}));
    wv_.forward(x, v_.reshape({n, v_.numel() / n}));
    if (rotates()) {
        ops::rope_fwd(q_, rope_base(), pos_offset(), q_, docs_.positions, position_limit());
        ops::rope_fwd(k_, rope_base(), pos_offset(), k_, docs_.positions, position_limit());
    }
    if (cp_.active() && seg_.active()) {  // the segment's gathered keys join the cache (cp_attention.h)
        const auto [kw, vw] = cp_.gather_keys(k_, v_);
        const auto [keys, values] = window_ ? wkv_.keys(kw, vw) : kv_.forward_keys(kw, vw);
        cp_.segment_forward(q_, keys, values, key_lo(), attn_, lse_, max_logit_out());
    } else if (cp_.active()) {
        cp_.forward(q_, k_, v_, attn_, lse_, max_logit_out());
    } else if (seg_.active()) {  // the segment's keys join the cache; its queries see the cached ones before them
        const auto [keys, values] = window_ ? wkv_.keys(k_, v_) : kv_.forward_keys(k_, v_);
        ops::attention_fwd(q_, keys, values, attn_, lse_, {}, mask(), max_logit_out());
    } else {
        ops::attention_fwd(q_, k_, v_, attn_, lse_, {}, mask(), max_logit_out());
    }
    if (!merges_global()) return;
    if (mem_ >= 0) {
        const int64_t g = cfg_.attn.global_tokens;
        wk_.forward(table_->param(mem_), kg_.reshape({g, kg_.numel() / g}));
        wv_.forward(table_->param(mem_), vg_.reshape({g, vg_.numel() / g}));
    }
    ops::attention_global_fwd(q_, kg_, vg_, sink_ >= 0 ? table_->param(sink_) : Tensor(), attn_, lse_);
}

// Workspace slots: 0 d_attn, 1 d_q, 2 d_k, 3 d_v (all alive together from the attention backward on).
void AttentionLayer::reserve_scratch(Workspace& ws) const {
    const int64_t d = cfg_.resolved_head_dim(), n = batch_ * seq_;
    const size_t q = static_cast<size_t>(n * cfg_.n_heads * d) * core::dtype_size(act_dtype_);
    const size_t kv = static_cast<size_t>(n * cfg_.n_kv_heads * d) * core::dtype_size(act_dtype_);
    ws.reserve_slot(0, q), ws.reserve_slot(1, q), ws.reserve_slot(2, kv), ws.reserve_slot(3, kv);
}

void AttentionLayer::backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws) {
    if (!dropped_.empty()) {  // recompute attn_core
        dropped_.restore();
        forward_core(x);
    }
    const int64_t n = batch_ * seq_;
    auto flat = [n](const Tensor& t) { return t.reshape({n, t.numel() / n}); };
    const core::Device dev = x.device();
    const Tensor d_attn = ws.slot(0, attn_.shape(), attn_.dtype(), dev);
    const Tensor d_q = ws.slot(1, q_.shape(), q_.dtype(), dev);
    const Tensor d_k = ws.slot(2, k_.shape(), k_.dtype(), dev);
    const Tensor d_v = ws.slot(3, v_.shape(), v_.dtype(), dev);
    wo_.backward(flat(attn_), dout, flat(d_attn));
    if (seg_.active())  // with or without context parallelism
        segment_attention_backward(d_attn, d_q, d_k, d_v);
    else if (cp_.active())
        cp_.backward(q_, k_, v_, attn_, lse_, d_attn, d_q, d_k, d_v);
    else
        ops::attention_bwd(q_, k_, v_, attn_, lse_, d_attn, d_q, d_k, d_v, {}, mask());
    if (merges_global()) global_backward(d_attn, d_q);
    if (rotates()) {
        ops::rope_bwd(d_q, rope_base(), pos_offset(), d_q, docs_.positions, position_limit());
        ops::rope_bwd(d_k, rope_base(), pos_offset(), d_k, docs_.positions, position_limit());
    }
    // x feeds three projections: the k and v gradients add into dx inside their matmuls.
    wq_.backward(x, flat(d_q), dx);
    wk_.backward(x, flat(d_k), dx, /*accumulate_dx=*/true);
    wv_.backward(x, flat(d_v), dx, /*accumulate_dx=*/true);
    dropped_.release();
}

// With segments the queries saw cached keys [lo, first) before the segment's own: their key and value gradients
// from these queries add into the accumulators, and the segment's own (d_k, d_v: written) are these queries' part
// plus what every later segment accumulated for them (the backward runs the segments last first). Under context
// parallelism the cache holds the gathered segment and every gradient is this rank's queries' part: the segment's own
// rows are summed over the group and each rank keeps its own (a reduce-scatter).
void AttentionLayer::segment_attention_backward(const Tensor& d_attn,
                                                const Tensor& d_q,
                                                const Tensor& d_k,
                                                const Tensor& d_v) {
    const bool cp = cp_.active();
    Shape shape = k_.shape();
    shape[1] = window_ ? wkv_.key_rows() : kv_.key_rows();
    const Tensor dk_all = Tensor::scratch(shape, act_dtype_, device_);
    const Tensor dv_all = Tensor::scratch(shape, act_dtype_, device_);
    std::pair<Tensor, Tensor> kv;
    if (window_) {  // a window layer keeps only the rows before the segment: its own come from k_, v_ (gathered)
        const auto [own_k, own_v] = cp ? cp_.gather_keys(k_, v_) : std::pair{k_, v_};
        kv = wkv_.keys(own_k, own_v);
    } else {
        kv = kv_.backward_keys();
    }
    if (cp)
        cp_.segment_backward(q_, kv.first, kv.second, key_lo(), attn_, lse_, d_attn, d_q, dk_all, dv_all);
    else
        ops::attention_bwd(q_, kv.first, kv.second, attn_, lse_, d_attn, d_q, dk_all, dv_all, {}, mask());
    shape[1] = seg_.length;
    const Tensor own_dk = cp ? Tensor::scratch(shape, act_dtype_, device_) : d_k;
    const Tensor own_dv = cp ? Tensor::scratch(shape, act_dtype_, device_) : d_v;
    if (window_)
        wkv_.backward_grads(dk_all, dv_all, own_dk, own_dv);
    else
        kv_.backward_grads(dk_all, dv_all, own_dk, own_dv);
    if (!cp) return;
    cp_.reduce_scatter(own_dk, d_k);
    cp_.reduce_scatter(own_dv, d_v);
}

// The global tokens' and the sink's terms (attention_bwd above already had the merged out and lse): d_q gains the
// global keys' part, the sink logits' gradient accumulates, and dkg, dvg flow back through the k and v projections
// to their weights and to the memory embeddings.
void AttentionLayer::global_backward(const Tensor& d_attn, const Tensor& d_q) {
    const core::Device dev = q_.device();
    Tensor dkg, dvg;
    if (mem_ >= 0) {
        dkg = Tensor::scratch(kg_.shape(), kg_.dtype(), dev);
        dvg = Tensor::scratch(vg_.shape(), vg_.dtype(), dev);
    }
    const Tensor sink = sink_ >= 0 ? table_->param(sink_) : Tensor();
    const Tensor dsink = sink_ >= 0 ? table_->grad(sink_) : Tensor();
    ops::attention_global_bwd(q_, kg_, vg_, sink, attn_, lse_, d_attn, d_q, dkg, dvg, dsink);
    if (mem_ >= 0) {
        const int64_t g = cfg_.attn.global_tokens;
        const Tensor mem = table_->param(mem_);
        const Tensor dmem = Tensor::scratch(mem.shape(), mem.dtype(), dev);  // the gradient's dtype may differ
        wk_.backward(mem, dkg.reshape({g, dkg.numel() / g}), dmem);
        wv_.backward(mem, dvg.reshape({g, dvg.numel() / g}), dmem, /*accumulate_dx=*/true);
        ops::add_fwd(table_->grad(mem_), dmem, table_->grad(mem_));
    }
}

std::vector<SavedTensor> AttentionLayer::saved_for_backward() {
    std::vector<SavedTensor> saved = {{"q", &q_}, {"k", &k_}, {"v", &v_}, {"attn", &attn_}, {"lse", &lse_}};
    if (mem_ >= 0) saved.insert(saved.end(), {{"kg", &kg_}, {"vg", &vg_}});
    return saved;
}

}  // namespace mt::nn
