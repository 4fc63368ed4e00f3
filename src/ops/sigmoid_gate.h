// Elementwise sigmoid gate (KDA's output gate, kda.md §1): out = x * sigmoid(z).
//   x, z, out, dout, dx, dz: same shape, any rank (flattened); f32|f64
// Saves nothing beyond its inputs. _bwd: dx = dout sigmoid(z), dz = dout x s (1 - s), both written (=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out);
void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz);

}  // namespace mt::ops
