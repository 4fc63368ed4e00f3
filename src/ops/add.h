// Elementwise add, the residual connection: out = a + b (out may alias a or b).
//   a, b, out: same shape, f32|f64
// _bwd accumulates (+=) dout into da and db, as residual-stream gradients sum over branches.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out);
void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db);

}  // namespace mt::ops
