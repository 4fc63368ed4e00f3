// Pre-norm transformer block: h = x + Attn(RMSNorm(x)); out = h + Mlp(RMSNorm(h)).
#pragma once

#include "nn/attention_layer.h"
#include "nn/mlp.h"

namespace mt::nn {

class Block : public Layer {
   public:
    Block(ParamTable& table, const std::string& prefix, const ModelConfig& cfg);

    void resize(int64_t batch, int64_t seq, const Precision& precision);
    // x: [N, C] the block input (kept alive by the caller until backward). Result in output().
    void forward(const Tensor& x, Workspace& ws);
    // dout: [N, C] gradient w.r.t. output(); dx: [N, C] written (=), must not alias dout.
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    const Tensor& output() const {
        return out_;
    }
    std::vector<SavedTensor> saved_for_backward() override;

   private:
    ModelConfig cfg_;
    int attn_norm_ = -1, mlp_norm_ = -1;
    ParamTable* table_;
    AttentionLayer attn_;
    Mlp mlp_;
    Tensor norm1_, norm2_;  // [N, C] normed inputs of the two branches
    Tensor rstd1_, rstd2_;  // [N] in the statistics dtype
    Tensor h_;              // [N, C] residual after attention
    Tensor out_;            // [N, C] block output
};

}  // namespace mt::nn
