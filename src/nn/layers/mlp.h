// SwiGLU MLP: out = W_down (silu(W_gate x) * W_up x).
#pragma once

#include "nn/layer.h"
#include "nn/layers/linear.h"
#include "nn/model_config.h"
#include "nn/workspace.h"

namespace mt::nn {

class Mlp : public Layer {
   public:
    Mlp(ParamTable& table, const std::string& prefix, const ModelConfig& cfg);

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
    ModelConfig cfg_;
    Linear w_gate_, w_up_, w_down_;
    Tensor gate_, up_, act_;  // [N, F]
};

}  // namespace mt::nn
