// Kimi Delta Attention layer (kda.md §1), a linear-time token mixer with the interface of AttentionLayer (x [N, C]
// in, out [N, C] out), so that a Block can hold either:
//   q, k, v = SiLU(conv4(W_q x)), SiLU(conv4(W_k x)), SiLU(conv4(W_v x));  q, k L2-normalised per head, q * K^-1/2
//   beta = sigmoid(W_beta x);  g = gate(W_fb W_fa x; A_log, dt_bias)  (lower-bounded by default, or softplus)
//   o, S_T = KDA(q, k, v, g, beta; S_0)
//   out = W_o [RMSNorm_head(o) * sigmoid(W_gb W_ga x)]
// Settings come from ModelConfig::kda (kda.md §6). An initial state S_0 [B, HV, K, V] may be given and the final state
// S_T is kept; backward takes an optional dS_T and returns dS_0. Parameter names follow Kimi Linear's Hugging Face
// names under the prefix: q_proj, k_proj, v_proj, q_conv1d, k_conv1d, v_conv1d (weights [C, 4]), f_a_proj, f_b_proj,
// A_log, dt_bias, b_proj, g_a_proj, g_b_proj, o_norm, o_proj. Sequence segments (set_segment) carry the state and
// the short convs' halo from one segment to the next; context parallelism (nn/layers/kda_cp.h) across the cp ranks'
// spans. Not yet: the output-gate bias.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "nn/context_parallel.h"
#include "nn/documents.h"
#include "nn/layer.h"
#include "nn/layers/kda_cp.h"
#include "nn/layers/linear.h"
#include "nn/model_config.h"
#include "nn/recompute.h"
#include "nn/segments.h"
#include "nn/workspace.h"
#include "ops/kda.h"
#include "ops/kda_gate.h"

namespace mt::nn {

class KdaLayer : public Layer {
   public:
    // Settings from cfg.kda. A_log and dt_bias carry kda.md §3's init in the parameter table (A_log = 0 for the
    // bounded gate, log U(1, 16) for softplus; dt_bias = log(e^delta - 1), delta log-uniform in [1e-3, 1e-1]), so
    // ParamTable::initialize sets them. Contract (exit 1, MT_CHECK, as every layer's; the config parser rejects each
    // first with exit 2, naming the key): kda.num_v_heads a multiple of kda.num_heads, kda.conv_size >= 1.
    // tp: this rank holds kda.num_heads / tp key heads and kda.num_v_heads / tp value heads (split by head: the q, k,
    // v, beta, f_b and g_b projections column-parallel, their conv filters, A_log and dt_bias by head, o_proj
    // row-parallel); the low-rank down projections f_a, g_a and the output norm's gain stay whole, each rank holding
    // a part of their gradient. The recurrence is head-local: no communication inside the layer.
    KdaLayer(ParamTable& table,
             const std::string& prefix,
             const ModelConfig& cfg,
             const TensorParallel& tp = {},
             const ContextParallel& cp = {});

    void resize(int64_t batch, int64_t seq, const Precision& precision);
    // S_0 [B, HV, K, V] in the compute dtype, or undefined for the zero state; kept until changed.
    void set_initial_state(const Tensor& s0);
    // x: [N, C] (the normed residual) -> out: [N, C]; final_state() then holds S_T [B, HV, K, V].
    // training = false (evaluation) keeps nothing for a backward (kda.save), whatever the config.
    void forward(const Tensor& x, const Tensor& out, bool training = true);
    // metrics.layer_stats: the next forward adds its gate's statistics to slots ([4] f64, nn/layer_stats.h: count,
    // sum of g, -, #(g <= low)); undefined: nothing (every forward but a metrics step's first).
    void set_layer_stats(const Tensor& slots, double low) {
        stats_ = slots;
        stats_low_ = low;
    }
    // Sizes the workspace slots backward takes (after resize), so that none grows during training.
    void reserve_scratch(Workspace& ws) const;
    // dS_T for the next backward, or undefined (zero); kept until changed.
    void set_final_state_grad(const Tensor& dst);
    // dout: [N, C] -> dx: [N, C] written (=); parameter grads accumulate; initial_state_grad() then holds dS_0 when
    // an initial state was set. Scratch from ws's slots 0-5 (see reserve_scratch's table in kda_layer.cpp).
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);

    // S_T of the last forward; with segments, of the whole sequence (the last segment's, whatever ran since).
    Tensor final_state() const {
        return seg_.active() ? seg_final_ : st_;
    }
    Tensor initial_state_grad() const {
        return ds0_;
    }
    // H, HV, K, V after defaults.
    int64_t num_heads() const {
        return h_;
    }
    int64_t num_v_heads() const {
        return hv_;
    }
    int64_t head_dim() const {
        return k_dim_;
    }
    int64_t head_v_dim() const {
        return v_dim_;
    }
    std::vector<SavedTensor> saved_for_backward() override;
    // The packed documents of the next forward and its backward (document masking): the state and the short conv's
    // halo restart at every document. Undefined: each row is one document.
    void set_documents(const Documents& docs) {
        kda_options_.doc_start = docs.doc_start;
    }
    // The sequence segment the next forward (and its backward) runs (long_context.md §4; after resize and
    // set_documents with the segment's documents). Segment j > 0 starts from segment j - 1's final state (zero in
    // the rows where a document starts at the segment) and its short convs read the W - 1 projection rows before
    // it; its backward passes the gradients of both to segment j - 1's. The first segment starts from the initial
    // state (set_initial_state); every segment before the last needs at least W - 1 tokens.
    void set_segment(const SegmentContext& seg);
    // Context parallelism: the whole sequence the next forward's tokens belong to.
    void set_context_parallel(const CpBatch& batch) {
        cp_.begin(batch, batch_, device_);
    }

   private:
    // Everything but the output projection, from x (into y_): what recompute kda re-runs. keep: let the op keep
    // what its backward reuses (kda.save).
    void forward_core(const Tensor& x, bool keep);
    // The state the recurrence starts from: the segment's carried one, or the initial state.
    const Tensor& start_state() const {
        return seg_.active() && seg_.index > 0 ? cur_s0_ : s0_;
    }
    // Short conv number `which` (0 q, 1 k, 2 v) of the projection xp [N, C] into y [B, T, C], and its backward
    // (dxp written; with a halo, the halo rows' gradient into dhalo).
    bool has_halo() const {
        return seg_.active() && seg_.index > 0 && cfg_.kda.conv_size > 1;
    }
    void conv_forward(int which, const Tensor& xp, const Tensor& y);
    void conv_backward(int which, const Tensor& xp, const Tensor& dy, const Tensor& dxp, Tensor& dhalo);
    // At the end of a segment's first forward: what the next segment starts from.
    void keep_for_next_segment();

    ModelConfig cfg_;
    DropList dropped_;  // recompute kda: every saved activation (the kept tiles are freed apart)
    ops::KdaOptions kda_options_;
    ops::KdaGateOptions gate_options_;
    int64_t h_ = 0, hv_ = 0, k_dim_ = 0, v_dim_ = 0;
    ParamTable* table_ = nullptr;
    Linear wq_, wk_, wv_, wfa_, wfb_, wb_, wga_, wgb_, wo_;
    int conv_q_ = -1, conv_k_ = -1, conv_v_ = -1, a_log_ = -1, dt_bias_ = -1, o_norm_ = -1;
    int64_t batch_ = 0, seq_ = 0;
    core::DType act_dtype_ = core::DType::f32;  // the compute dtype of the activations and their gradients
    core::Device device_ = core::Device::cpu;
    Tensor s0_, dst_;
    // What the KDA op keeps from a training forward to its backward (GPU only; kda.save), freed after the backward.
    bool keep_saved_ = false;
    ops::KdaSaved kept_;
    // Saved activations (N = B * T rows).
    Tensor qp_, kp_, vp_;     // [N, H*K], [N, H*K], [N, HV*V]: projections before the conv
    Tensor qc_, kc_, vc_;     // after conv + SiLU (vc_ is the op's v)
    Tensor q_, k_, rq_, rk_;  // [B, T, H, K] normalised, and their 1 / norms [N * H]
    Tensor bl_, beta_;        // [N, HV] beta logits (scratch), [B, T, HV]
    Tensor fa_, u_, g_;       // [N, K], [N, HV*K], [B, T, HV, K]
    Tensor stats_;            // set_layer_stats
    double stats_low_ = 0.0;
    Tensor o_, st_;       // [B, T, HV, V], [B, HV, K, V]
    Tensor on_, rstd_;    // [N, HV*V] normed output, [N * HV]
    Tensor ga_, gz_, y_;  // [N, V], [N, HV*V] gate logits, [N, HV*V] gated output
    Tensor ds0_;          // [B, HV, K, V] dS_0, the backward's output when an initial state was set
    // Sequence segments: per segment its start state and its three convs' halos [B, W - 1, C] (in pinned host
    // memory with long.offload_kv), the carried values of the next segment (forward) and the gradients for the
    // previous one (backward), and the whole sequence's S_T.
    SegmentContext seg_;
    std::vector<Tensor> seg_s0_;
    std::vector<std::array<Tensor, 3>> seg_halo_;
    Tensor next_s0_, pending_dst_, seg_final_, cur_s0_;
    std::array<Tensor, 3> next_halo_, pending_dhalo_, cur_halo_;  // cur: the current segment's, on the device
    std::vector<int64_t> doc_start_rows_;  // rows where a document starts at the segment's first token
    Tensor conv_doc_start_;                // [B, W - 1 + T] the halo'd convs' document map, or undefined
    KdaCp cp_;  // context parallelism: the state and the halo across the spans (nn/layers/kda_cp.h)
    // [B, T, C] view of an [N, C] projection.
    Tensor seq_rows(const Tensor& t) const {
        return t.reshape({batch_, seq_, t.size(1)});
    }
};

}  // namespace mt::nn
