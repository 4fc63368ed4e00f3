// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row.
//   x:      [N, C] f32|f64
//   weight: [C]
//   y:      [N, C]
//   rstd:   [N] saved for backward: 1 / sqrt(mean(x^2) + eps)
// _bwd: dx written (=); dweight accumulates (+=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void rmsnorm_fwd(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd);
void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight);

}  // namespace mt::ops
