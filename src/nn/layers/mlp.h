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
    // dout: [N, C] -> dx: [N, C] written (=); parameter grads accumulate.
    void backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Workspace& ws);
    std::vector<SavedTensor> saved_for_backward() override;

   private:
    ModelConfig cfg_;
    Linear w_gate_, w_up_, w_down_;
    Tensor gate_, up_, act_;  // [N, F]
};

}  // namespace mt::nn
