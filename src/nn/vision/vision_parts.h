// The two parameterised pieces the vision encoder and the projector are built from, both as PyTorch has them:
// a linear map with a bias (nn.Linear) and a LayerNorm with a gain and a bias (nn.LayerNorm). The weight's optimizer
// group is the caller's (muon.md §2: the ViT's and the projector's matrices are Muon's, the patch embedding
// AdamW's); biases, gains and norm biases are AdamW's without decay.
#pragma once

#include <string>

#include "nn/param_table.h"

namespace mt::nn {

class BiasedLinear {
   public:
    BiasedLinear() = default;
    // Declares `name`.weight [out, in] (normal init_std, in `group`) and `name`.bias [out] (zeros).
    BiasedLinear(ParamTable& table,
                 const std::string& name,
                 int64_t in,
                 int64_t out,
                 double init_std,
                 OptimGroup group = OptimGroup::muon,
                 int64_t head_rows = 0);
    // x [N, in] -> y [N, out] = x W^T + b
    void forward(const Tensor& x, const Tensor& y) const;
    // dx [N, in] written (=), or added to with accumulate_dx, skipped when undefined; dW and db accumulate.
    void backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate_dx = false) const;

   private:
    ParamTable* table_ = nullptr;
    int weight_ = -1, bias_ = -1;
};

class LayerNorm {
   public:
    LayerNorm() = default;
    // Declares `name`.weight [dim] (ones) and `name`.bias [dim] (zeros).
    LayerNorm(ParamTable& table, const std::string& name, int64_t dim, double eps);
    // x [N, dim] -> y; mean, rstd [N] (the statistics dtype) saved for backward.
    void forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd) const;
    // dx written (=), plus dresidual when defined (may be dx itself); the gain's and bias's gradients accumulate.
    void backward(const Tensor& x,
                  const Tensor& mean,
                  const Tensor& rstd,
                  const Tensor& dy,
                  const Tensor& dx,
                  const Tensor& dresidual = Tensor()) const;

   private:
    ParamTable* table_ = nullptr;
    int weight_ = -1, bias_ = -1;
    double eps_ = 1e-6;
};

}  // namespace mt::nn
