// Global L2 norm over a list of tensors: sqrt(sum over tensors of sum(x^2)), accumulated in f64 in a fixed
// order (fixed-size blocks, summed in block order), so the result does not depend on the thread count.
//   tensors: any shapes, contiguous, f32|f64
#pragma once

#include <vector>

#include "ops/op_common.h"

namespace mt::ops {

double global_norm_sq(const Tensor& t);
double global_norm(const std::vector<Tensor>& tensors);

}  // namespace mt::ops
