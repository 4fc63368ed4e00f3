// SwiGLU MLP: out = W_down (silu(W_gate x) * W_up x). Under tensor parallelism each rank holds d_ff / tp of the
// hidden features (W_gate, W_up column-parallel, W_down row-parallel) and its output is a part of the sum over tp.
#pragma once

#include "nn/layer.h"
#include "nn/layers/linear.h"
#include "nn/model_config.h"
#include "nn/recompute.h"
#include "nn/workspace.h"

namespace mt::nn {

class Mlp : public Layer {
   public:
    Mlp(ParamTable& table, const std::string& prefix, const ModelConfig& cfg, const TensorParallel& tp = {});

    // Drop the SwiGLU output after the forward and recompute it in the backward (recompute mlp_act, or moe_act for
    // the shared experts: the owner says which). Before resize.
    void set_drop_act(bool drop) {
        drop_act_ = drop;
    }
    void resize(int64_t n, const Precision& precision);
    // x: [N, C] (the normed residual) -> out: [N, C]
    void forward(const Tensor& x, const Tensor& out);
    // Sizes the workspace slots backward takes (after resize), so that none grows during training.
    void reserve_scratch(Workspace& ws) const;
    // dout: [N, C] -> dx: [N, C] written (=, must not be a slot); parameter grads accumulate; scratch from ws's
    // slots 0-2.
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    std::vector<SavedTensor> saved_for_backward() override;

   private:
    ModelConfig cfg_;  // d_ff is this rank's share
    Linear w_gate_, w_up_, w_down_;
    Tensor gate_, up_, act_;  // [N, F]
    bool drop_act_ = false;
    DropList dropped_;  // act_ when drop_act_
};

}  // namespace mt::nn
