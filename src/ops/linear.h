// Linear layer / matmul through BLAS: y = x @ w^T (+ bias). Weight layout [out, in] as in PyTorch.
//   x:    [N, K] f32|f64
//   w:    [M, K]
//   bias: [M] or undefined (no bias)
//   y:    [N, M]
// _bwd: dx [N, K] is written (=), or with accumulate_dx added to (+=: a second use of x, such as the k and v
// projections of one input, adds its gradient inside the matmul instead of through a separate add); skipped when
// undefined. dw [M, K] accumulates (+=), or is written (=) with accumulate_dw false: the first gradient of a step,
// whose buffer holds zeros (nn::ParamTable::first_grad_write), then costs no read of dw, the same values (the sum
// into zeros, signed zeros aside). dbias [M] accumulates (+=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y);
void linear_bwd(const Tensor& x,
                const Tensor& w,
                const Tensor& dy,
                const Tensor& dx,
                const Tensor& dw,
                const Tensor& dbias,
                bool accumulate_dx = false,
                bool accumulate_dw = true);

}  // namespace mt::ops
