// Pre-norm transformer block: h = x + Mixer(RMSNorm(x)); out = h + Ffn(RMSNorm(h)). The token mixer is global
// softmax attention (AttentionLayer, parameters `<prefix>.attn.*`, norm `<prefix>.attn_norm`) or Kimi Delta
// Attention (KdaLayer, `<prefix>.kda.*`, norm `<prefix>.kda_norm`); ModelConfig::layer_pattern picks it per layer.
// The FFN (norm `<prefix>.mlp_norm`) is a dense SwiGLU MLP (`<prefix>.mlp.*`) or a Mixture-of-Experts layer
// (MoeLayer, `<prefix>.moe.*`); ModelConfig::layer_is_moe picks it. Under tensor parallelism (nn/tensor_parallel.h)
// each branch is a tensor-parallel region: the norm runs on the stream rows this rank holds, the sub-layer on its
// shard of the weights over the whole micro-batch's rows (all-gathered under sequence parallelism), and its output
// is summed over tp (all-reduce, or reduce-scatter into this rank's rows).
#pragma once

#include <memory>
#include <optional>

#include "nn/layers/attention_layer.h"
#include "nn/layers/kda_layer.h"
#include "nn/layers/mlp.h"
#include "nn/layers/moe_layer.h"

namespace mt::nn {

// attention: global causal softmax attention; window_attention: the same layer with attn.window, the global tokens
// and window_rope_base (long_context.md §2); kda: Kimi Delta Attention.
enum class Mixer { attention, window_attention, kda };

class Block : public Layer {
   public:
    // moe: the FFN is an MoeLayer (with ep, this rank's share of its experts) instead of the dense MLP. tp: this
    // rank's shard of the sub-layers (the block's input and output are its stream rows, tp.stream_rows(B T)). cp:
    // the block's rows are this rank's zigzag tokens; only the token mixer communicates.
    Block(ParamTable& table,
          const std::string& prefix,
          const ModelConfig& cfg,
          Mixer mixer = Mixer::attention,
          bool moe = false,
          const MoeExpertParallel& ep = {},
          const TensorParallel& tp = {},
          const ContextParallel& cp = {});

    void resize(int64_t batch, int64_t seq, const Precision& precision);
    // Sizes the workspace slots the sub-layers' backwards take (after resize).
    void reserve_scratch(Workspace& ws) const;
    // x: [N, C] the block input (kept alive by the caller until backward). Result in output().
    void forward(const Tensor& x, Workspace& ws);
    // dout: [N, C] gradient w.r.t. output(); dx: [N, C] written (=), must not alias dout.
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    const Tensor& output() const {
        return out_;
    }
    // The two sub-layers on their own, for Block Attention Residuals (nn/layers/attnres.h), which replaces the residual
    // adds: sub 0 is Mixer(RMSNorm(h)), sub 1 is Mlp(RMSNorm(h)); out [N, C] written. branch_backward takes the
    // same h and writes dh (=), or with dresidual defined dh = dresidual + the branch's gradient (the residual
    // stream's gradient joins in the norm's backward; dresidual may alias dh). dout may alias dh only with
    // dresidual = dh: each mixer reads dout before the norm's backward writes dh.
    // With residual defined (sub 1 only), h + residual is the branch's input: the add runs inside the norm and writes
    // the sum to `sum` (the plain stream's h_), so the stream is read and written once.
    void branch_forward(int sub,
                        const Tensor& h,
                        const Tensor& out,
                        Workspace& ws,
                        const Tensor& residual = Tensor(),
                        const Tensor& sum = Tensor());
    void branch_backward(int sub,
                         const Tensor& h,
                         const Tensor& dout,
                         const Tensor& dh,
                         Workspace& ws,
                         const Tensor& dresidual = Tensor());
    Mixer mixer() const {
        return mixer_;
    }
    // The attention mixer, or null for a KDA block.
    AttentionLayer* attention() {
        return attn_ ? &*attn_ : nullptr;
    }
    // The KDA mixer, or null for an attention block.
    const KdaLayer* kda() const {
        return kda_ ? &*kda_ : nullptr;
    }
    // The MoE FFN, or null for a dense MLP block.
    MoeLayer* moe() {
        return moe_.get();
    }
    // The RoPE base of a global attention mixer (AttentionLayer::set_rope_theta).
    void set_rope_theta(double theta) {
        if (attn_) attn_->set_rope_theta(theta);
    }
    // The packed documents of the next forward and its backward, for the token mixer (document masking).
    void set_documents(const Documents& docs) {
        if (attn_) attn_->set_documents(docs);
        if (kda_) kda_->set_documents(docs);
    }
    // The sequence segment of the next forward and its backward, for the token mixer (long_context.md §4), and
    // the pass that runs next (backward: true), for the offloaded keys' staging.
    void set_segment(const SegmentContext& seg) {
        if (attn_) attn_->set_segment(seg);
        if (kda_) kda_->set_segment(seg);
    }
    // Context parallelism: the whole sequence the next forward's tokens belong to, for the token mixer.
    void set_context_parallel(const CpBatch& batch) {
        if (attn_) attn_->set_context_parallel(batch);
        if (kda_) kda_->set_context_parallel(batch);
    }
    void set_backward_phase(bool on) {
        if (attn_) attn_->set_backward_phase(on);
    }
    // Training forwards count the MoE routing for balancing and metrics, and let KDA layers keep what their backward
    // reuses (kda.save); evaluation forwards do neither.
    void set_training(bool training) {
        count_routing_ = keep_ = training;
    }
    // The two apart, for recompute full: the first forward counts the routing and keeps nothing the block's
    // activations are dropped anyway; the forward re-run in the backward keeps, and does not count again.
    void set_forward_flags(bool count_routing, bool keep) {
        count_routing_ = count_routing;
        keep_ = keep;
    }
    // metrics.layer_stats: the block's slots of the step's stat buffer ([8] f64 view, nn/layer_stats.h: the output's
    // moments, then a KDA mixer's gate), which the block's first training forward adds to (not a recompute's, not
    // evaluation's: the routing counts' rule); undefined: nothing. kda_low: layer_stats_kda_low.
    void set_layer_stats(const Tensor& slots, double kda_low) {
        stats_ = slots;
        stats_kda_low_ = kda_low;
    }
    // Recompute full: frees every activation the backward needs (and the block output with `output`), or brings
    // them back (contents undefined) for a forward to fill. The first call's shapes are kept.
    void release_activations(bool output);
    void release_output() {
        out_ = Tensor();
    }
    void restore_activations();
    std::vector<SavedTensor> saved_for_backward() override;

   private:
    // What sub-layer `sub` keeps for its backward (its norm's output and statistics, and the mixer's or the FFN's).
    std::vector<SavedTensor> branch_saved(int sub);
    void mixer_forward(const Tensor& h, const Tensor& out);
    void ffn_branch_forward(const Tensor& h, const Tensor& out, const Tensor& residual, const Tensor& sum);
    ModelConfig cfg_;
    int mixer_norm_ = -1, mlp_norm_ = -1;
    ParamTable* table_;
    void ffn_forward(const Tensor& x, const Tensor& out);
    void ffn_backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    // The tensor-parallel region of branch `sub`: its input (the norm's output, or under sequence parallelism their
    // all-gather), and the buffer the sub-layer writes its part of the output to (out, or a whole-rows scratch).
    const Tensor& region_input(int sub);
    Tensor region_output(const Tensor& out) const;
    // The sub-layer's backward inside the region: dout (stream rows) -> d of the norm's output (stream rows), in
    // ws.d_norm.
    Tensor region_backward(int sub, const Tensor& dout, Workspace& ws);
    // MoE under tp: the routed experts on this rank's own rows (MoeLayer, the tp ranks folded into expert
    // parallelism), the shared experts as a tensor-parallel region over every row, their outputs summed into the
    // stream rows. The backward writes d of the norm's output into ws.d_norm's stream rows.
    void moe_tp_forward(const Tensor& out);
    Tensor moe_tp_backward(const Tensor& dout, Workspace& ws);
    TensorParallel tp_;
    Mixer mixer_;
    std::optional<AttentionLayer> attn_;  // exactly one of attn_ and kda_ holds the mixer
    std::optional<KdaLayer> kda_;
    std::optional<Mlp> mlp_;  // exactly one of mlp_ and moe_ holds the FFN
    std::unique_ptr<MoeLayer> moe_;
    std::optional<Mlp> moe_shared_;  // MoE under tp: the shared experts, split over tp (`<prefix>.moe.shared.*`)
    bool count_routing_ = true, keep_ = true;
    Tensor stats_;  // set_layer_stats
    double stats_kda_low_ = 0.0;
    bool collecting_stats() const {
        return stats_.defined() && count_routing_ && !recomputing_;
    }
    DropList norm_dropped_[2];  // recompute norm: norm1_, norm2_
    DropList all_dropped_;      // recompute full: everything release_activations freed
    // Recompute full under Block AttnRes: each sub-layer frees its activations after its forward and re-runs the
    // forward from its mixed input in its backward (recomputing_ then).
    bool branch_recompute_ = false, recomputing_ = false;
    DropList branch_dropped_[2];
    Tensor norm1_, norm2_;   // [N, C] normed inputs of the two branches (N: the stream rows)
    Tensor gathered_[2];     // sequence parallelism: [B T, C] all-gathers of norm1_, norm2_ (the sub-layers' inputs)
    Tensor rstd1_, rstd2_;   // [N] in the statistics dtype
    Tensor h_;               // [N, C] residual after the mixer (not under Block AttnRes)
    Tensor out_;             // [N, C] block output (not under Block AttnRes)
    int64_t rows_ = 0;       // the stream rows N that resize last sized the buffers for
    int64_t full_rows_ = 0;  // the micro-batch's B T rows the sub-layers run on
};

}  // namespace mt::nn
