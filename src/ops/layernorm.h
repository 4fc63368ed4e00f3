// LayerNorm (the ViT's and the projector's norm, multimodal.md §1-§2; PyTorch's nn.LayerNorm over the last dim):
//   mean = sum(x) / C,  rstd = 1 / sqrt(sum((x - mean)^2) / C + eps)   (biased variance, as PyTorch)
//   y = (x - mean) * rstd * weight + bias, per row.
//   x, y:         [N, C] f32|f64 (CUDA: bf16|f16|f32, y the dtype of x)
//   weight, bias: [C]  (CUDA: bf16|f16|f32, bias the dtype of weight)
//   mean, rstd:   [N] saved for backward (the dtype of x on the CPU; f32 on CUDA for every x dtype)
// _bwd: dx written (=); dweight and dbias accumulate (+=) (CUDA: f32|bf16|f16, one dtype; f32 is Megatron's main_grad
// choice). With dresidual [N, C] defined, dx = dresidual + the norm's gradient: the residual stream's gradient that
// bypasses the norm joins in the same pass (dresidual may be dx itself).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void layernorm_fwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& bias,
                   double eps,
                   const Tensor& y,
                   const Tensor& mean,
                   const Tensor& rstd);
void layernorm_bwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& mean,
                   const Tensor& rstd,
                   const Tensor& dy,
                   const Tensor& dx,
                   const Tensor& dweight,
                   const Tensor& dbias,
                   const Tensor& dresidual = Tensor());

}  // namespace mt::ops
