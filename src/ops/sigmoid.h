// Elementwise logistic sigmoid (KDA's beta = sigmoid(W_beta x), kda.md §1): y = 1 / (1 + exp(-x)).
//   x, y, dy, dx: [N] any shape, flattened; f32|f64
// _bwd takes the forward's output y: dx = dy * y * (1 - y), written (=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void sigmoid_fwd(const Tensor& x, const Tensor& y);
void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx);

}  // namespace mt::ops
