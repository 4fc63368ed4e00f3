// Row L2 normalisation with a scale (KDA's q and k, kda.md §1): y = scale * x / sqrt(|x|^2 + eps).
//   x, y: [N, C] f32|f64 (for per-head norms pass [B * T * H, K])
//   rinv: [N], 1 / sqrt(|x|^2 + eps), saved by _fwd for _bwd
// _bwd: dx = scale * rinv * (dy - xh (xh . dy)), xh = x * rinv, written (=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void l2norm_fwd(const Tensor& x, double scale, double eps, const Tensor& y, const Tensor& rinv);
void l2norm_bwd(const Tensor& x, const Tensor& rinv, double scale, const Tensor& dy, const Tensor& dx);

}  // namespace mt::ops
