// Token embedding lookup.
//   ids:    [N] i32, each in [0, V)
//   weight: [V, C] f32|f64
//   out:    [N, C] same dtype as weight
// _fwd saves nothing beyond its inputs (ids). _bwd accumulates (+=) into dweight.
// An id outside [0, V) is an input-data error (exit 3) naming the position and the id.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out);
void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight);

}  // namespace mt::ops
