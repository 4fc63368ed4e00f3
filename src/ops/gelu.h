// Exact GELU (the ViT MLP's and the projector's activation, multimodal.md §1-§2; PyTorch's nn.GELU() default,
// approximate = "none"): y = 0.5 x (1 + erf(x / sqrt(2))) = x Phi(x).
//   x, y, dy, dx: any shape, contiguous, flattened (all one shape); f32|f64 (CUDA: bf16|f16|f32, all the dtype of x;
//   the math runs in f32)
// _bwd takes the forward's input x: dx = dy (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi); dx written (=).
// Elementwise: y may alias x, and dx may alias dy or x. Saves nothing beyond its input.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void gelu_fwd(const Tensor& x, const Tensor& y);
void gelu_bwd(const Tensor& x, const Tensor& dy, const Tensor& dx);

}  // namespace mt::ops
