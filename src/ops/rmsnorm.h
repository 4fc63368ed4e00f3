// RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row.
//   x:      [N, C] f32|f64
//   weight: [C]
//   y:      [N, C]
//   rstd:   [N] saved for backward: 1 / sqrt(mean(x^2) + eps)
// With residual [N, C] defined (and sum [N, C]): the residual stream's add fused in front, h = x + residual (in x's
// dtype: rounded as a separate add would round it) written to sum and normalised in place of x, so that the block's
// add and the next norm read and write the stream once (sum may alias x or residual; rstd is then h's).
// _bwd: dx written (=); dweight accumulates (+=). With dresidual [N, C] defined, dx = dresidual + the norm's
// gradient: the residual stream's gradient that bypasses the norm joins in the same pass instead of a separate add
// (dresidual may be dx itself).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void rmsnorm_fwd(const Tensor& x,
                 const Tensor& weight,
                 double eps,
                 const Tensor& y,
                 const Tensor& rstd,
                 const Tensor& residual = Tensor(),
                 const Tensor& sum = Tensor());
void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight,
                 const Tensor& dresidual = Tensor());

}  // namespace mt::ops
