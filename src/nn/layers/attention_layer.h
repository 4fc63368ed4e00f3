// Grouped-query self-attention: q/k/v projections, RoPE on q and k (unless ModelConfig::attn_rope() says no position
// encoding), causal softmax attention, output projection.
#pragma once

#include "nn/documents.h"
#include "nn/layer.h"
#include "nn/layers/linear.h"
#include "nn/model_config.h"
#include "nn/recompute.h"
#include "nn/workspace.h"

namespace mt::nn {

class AttentionLayer : public Layer {
   public:
    AttentionLayer(ParamTable& table, const std::string& prefix, const ModelConfig& cfg);

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

   private:
    // q, k, v and the attention output from x: what recompute attn_core re-runs.
    void forward_core(const Tensor& x);

    ModelConfig cfg_;
    DropList dropped_;  // recompute attn_core: every saved tensor
    Documents docs_;
    Linear wq_, wk_, wv_, wo_;
    int64_t batch_ = 0, seq_ = 0;
    core::DType act_dtype_ = core::DType::f32;  // the compute dtype
    Tensor q_, k_, v_;                          // [B, T, H, D] after RoPE (when on)
    Tensor attn_;                               // [B, T, Hq, D]
    Tensor lse_;                                // [B, Hq, T] in the statistics dtype
};

}  // namespace mt::nn
