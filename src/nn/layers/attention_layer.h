// Grouped-query self-attention: q/k/v projections, RoPE on q and k (unless ModelConfig::attn_rope() says no position
// encoding), causal softmax attention, output projection. A window layer (long_context.md §2) limits every query to
// the last attn.window keys, adds attn.global_tokens learned memory tokens whose keys and values every query sees
// (the layer's k and v projections of a [g, C] parameter, never rotated) and rotates q and k with base
// attn.window_rope_base (0: none). With attn.sink_logit every attention layer has a learned logit per head in its
// softmax denominator.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "nn/documents.h"
#include "nn/layer.h"
#include "nn/layers/cp_attention.h"
#include "nn/layers/linear.h"
#include "nn/layers/segment_kv.h"
#include "nn/layers/window_kv.h"
#include "nn/model_config.h"
#include "nn/qk_clip.h"
#include "nn/recompute.h"
#include "nn/segments.h"
#include "nn/workspace.h"
#include "ops/attention.h"

namespace mt::nn {

class AttentionLayer : public Layer {
   public:
    // window: this layer uses attn.window, the global tokens and attn.window_rope_base (ModelConfig::layer_is_window).
    // tp: this rank holds n_heads / tp query heads and n_kv_heads / tp key/value heads (Wq, Wk, Wv column-parallel,
    // Wo row-parallel, the sink logits split by head; the global tokens replicated, their gradient a part per rank);
    // its output is a part of the sum over tp. cp: the layer's rows are this rank's zigzag tokens and its queries
    // see the keys of the whole sequence, or a window layer's the w - 1 before each span (nn/layers/cp_attention.h).
    AttentionLayer(ParamTable& table,
                   const std::string& prefix,
                   const ModelConfig& cfg,
                   bool window = false,
                   const TensorParallel& tp = {},
                   const ContextParallel& cp = {});

    void resize(int64_t batch, int64_t seq, const Precision& precision);
    // x: [N, C] (the normed residual) -> out: [N, C]
    void forward(const Tensor& x, const Tensor& out);
    // Sizes the workspace slots backward takes (after resize), so that none grows during training.
    void reserve_scratch(Workspace& ws) const;
    // dout: [N, C] -> dx: [N, C] written (=); parameter grads accumulate; scratch from ws's slots 0-3.
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    std::vector<SavedTensor> saved_for_backward() override;
    // The packed documents of the next forward and its backward (document masking): queries see only their own
    // document's keys and RoPE positions restart at each document. Undefined: each row is one document.
    void set_documents(const Documents& docs) {
        docs_ = docs;
    }
    // The RoPE base of a global (not window) layer from the next forward on: the curriculum's per-stage base
    // (long_context.md §6, ABF). Window layers keep attn.window_rope_base.
    void set_rope_theta(double theta) {
        cfg_.rope_theta = theta;
    }
    // The sequence segment the next forward (and its backward) runs (long_context.md §4; after resize, which sizes
    // the layer for the segment). With segments the layer keeps the keys and values of every position of the
    // sequence (after RoPE) and the queries of a segment see the earlier positions' ones too (a window layer's, the
    // last w - 1); the backward accumulates the gradients of earlier positions' keys and values, which the segment
    // that owns them adds to its own. Set documents (the segment's) first.
    void set_segment(const SegmentContext& seg);
    // Context parallelism: the whole sequence the next forward's tokens belong to (set documents first: their
    // positions are the tokens' global ones).
    void set_context_parallel(const CpBatch& batch) {
        cp_.begin(batch);
    }
    // The pass that runs next: forward, or backward (with any recompute's re-run of the forward), for the
    // offloaded keys' staging (nn/layers/segment_kv.h). link_offload: the attention layers before and after this one.
    void set_backward_phase(bool on) {
        kv_.set_backward_phase(on);
    }
    void link_offload(AttentionLayer* next, AttentionLayer* prev) {
        kv_.link(next != nullptr ? &next->kv_ : nullptr, prev != nullptr ? &prev->kv_ : nullptr);
    }
    // Long-context metrics (long_context.md §9): with tracking on, every forward but a recompute's records the
    // largest pre-softmax logit q.k / sqrt(D) over its queries and their visible keys (not the global tokens or the
    // sink), kept as a running maximum until reset: a logit that grows with the length is what QK-clip caps.
    void set_track_max_logit(bool on) {
        track_max_logit_ = on;
    }
    void reset_max_logit() {
        max_logit_written_ = false;  // an earlier forward's row maxima are not this step's
        max_logit_ = -std::numeric_limits<double>::infinity();
        head_max_logit_.assign(head_max_logit_.size(), -std::numeric_limits<double>::infinity());
    }
    double max_logit() const {
        return max_logit_;
    }
    // Folds the last forward's row maxima (left on the device, so that a forward holds no synchronisation) into the
    // per-head and overall running maxima (under cp over the group, a collective); the model calls it after each
    // pass. Nothing when that forward recorded none or they were collected already. keep_buffer: the row maxima's
    // buffer stays allocated for the next forward (a captured step's replays write the address its capture saw);
    // else it is freed (one [B, Hq, T] buffer alive at a time, as before).
    void collect_max_logit(bool keep_buffer = false);
    // A captured forward's replay wrote the row maxima (its host code, which says so, does not run again).
    bool max_logit_written() const {
        return max_logit_written_;
    }
    void mark_max_logit_written() {
        max_logit_written_ = true;
    }
    // The same running maximum per query head of this rank (size n_heads / tp; under cp the max over the group, as
    // max_logit's), the S^h of QK-clip (muon.md §4): max_logit() is their maximum.
    const std::vector<double>& head_max_logit() const {
        return head_max_logit_;
    }
    // QK-clip (nn/qk_clip.h): the parameter table indices of Wq [Hq * D, C] and Wk [Hkv * D, C] (this rank's rows,
    // head-major), D, this rank's head counts, and the row factors from the tracked per-head maxima (a replicated kv
    // head under tp > n_kv_heads needs its group maximum reduced over the replicas first: qk_clip.h).
    int wq_param() const {
        return wq_.index();
    }
    int wk_param() const {
        return wk_.index();
    }
    int64_t head_dim() const {
        return cfg_.head_dim;
    }
    int64_t local_heads() const {
        return cfg_.n_heads;
    }
    int64_t local_kv_heads() const {
        return cfg_.n_kv_heads;
    }
    QkClipFactors qk_clip_factors(double tau = kQkClipTau, double alpha = kQkClipAlpha) const {
        return nn::qk_clip_factors(head_max_logit_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, tau, alpha);
    }

   private:
    // q, k, v and the attention output from x: what recompute attn_core re-runs.
    void forward_core(const Tensor& x);
    bool rotates() const {
        return window_ ? cfg_.attn.window_rope_base > 0 : cfg_.attn_rope();
    }
    double rope_base() const {
        return window_ ? cfg_.attn.window_rope_base : cfg_.rope_theta;
    }
    ops::AttentionMask mask() const {
        return {.doc_start = seg_.active() ? key_doc_start_ : docs_.doc_start,
                .window = window_ ? cfg_.attn.window : 0};
    }
    // With segments: the first cached position the segment's queries may see (0, or a window's reach).
    int64_t key_lo() const {
        return window_ ? std::max<int64_t>(0, seg_.first - (cfg_.attn.window - 1)) : 0;
    }
    bool merges_global() const {
        return mem_ >= 0 || sink_ >= 0;
    }
    void global_backward(const Tensor& d_attn, const Tensor& d_q);
    void segment_attention_backward(const Tensor& d_attn, const Tensor& d_q, const Tensor& d_k, const Tensor& d_v);
    // RoPE's position of the layer's first row: the segment's start (document masking gives positions instead).
    int64_t pos_offset() const {
        return seg_.active() && !docs_.positions.defined() ? seg_.first : 0;
    }
    Shape lse_shape() const {
        return {batch_, cfg_.n_heads, seq_};
    }
    // The row maxima the forward writes when it records the max logit, else undefined (not written).
    Tensor max_logit_out() const {
        return record_max_logit_ ? row_max_logit_ : Tensor();
    }
    // Document positions in a segment run up to its end in the whole sequence, a cp rank's up to the sequence's end.
    int64_t position_limit() const {
        return seg_.active() ? seg_.first + seg_.length : cp_.active() ? cp_.total() : 0;
    }

    ModelConfig cfg_;   // n_heads and n_kv_heads are this rank's shares
    DropList dropped_;  // recompute attn_core: every saved tensor
    Documents docs_;
    Linear wq_, wk_, wv_, wo_;
    bool window_ = false;
    ParamTable* table_ = nullptr;
    int mem_ = -1;   // the global tokens' embeddings [g, C] (window layers with g > 0)
    int sink_ = -1;  // the sink logits [Hq] (attn.sink_logit)
    int64_t batch_ = 0, seq_ = 0;
    core::DType act_dtype_ = core::DType::f32;  // the compute dtype
    core::Device device_ = core::Device::cpu;
    core::DType lse_dtype_ = core::DType::f32;  // the statistics dtype
    Tensor q_, k_, v_;                          // [B, T, H, D] after RoPE (when on)
    Tensor attn_;                               // [B, T, Hq, D]
    Tensor lse_;                                // [B, Hq, T] in the statistics dtype
    Tensor kg_, vg_;                            // [g, Hkv, D]: the global tokens' keys and values
    // Sequence segments: the keys and values of every position with their gradient accumulators, and the document
    // map [B, Tk] of the keys the current segment sees.
    SegmentContext seg_;
    SegmentKv kv_;    // a global layer's
    WindowKv wkv_;    // a window layer's
    CpAttention cp_;  // context parallelism
    Tensor key_doc_start_;
    // The max pre-softmax logit: tracking on, the running maximum, and whether this forward records ([B, Hq, T]).
    bool track_max_logit_ = false, record_max_logit_ = false;
    bool max_logit_written_ = false;  // the last forward wrote row_max_logit_ (collect_max_logit folds it in)
    double max_logit_ = -std::numeric_limits<double>::infinity();
    std::vector<double> head_max_logit_;  // [n_heads], the running maximum per head
    Tensor row_max_logit_;
};

}  // namespace mt::nn
