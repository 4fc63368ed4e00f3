// SwiGLU gate: out = silu(gate) * up, silu(x) = x * sigmoid(x).
//   gate, up, out: [N, F] f32|f64
// _bwd: dgate, dup written (=). Saves nothing beyond its inputs.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out);
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate, const Tensor& dup);

}  // namespace mt::ops
