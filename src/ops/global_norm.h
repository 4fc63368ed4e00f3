// Global L2 norm over a list of tensors: sqrt(sum over tensors of sum(x^2)), accumulated in f64 in a fixed
// order (fixed-size blocks, summed in block order), so the result does not depend on the thread count.
//   tensors: any shapes, contiguous, f32|f64 (CUDA: bf16|f16|f32, lists may mix them)
// global_norms_sq: the sums of squares of several groups of tensors at once, group[i] in [0, groups) naming tensor i's
// group; out[g] = sum over the tensors of group g of sum(x^2), accumulated as global_norm does (on the GPU one pass
// over all of them and one synchronisation, where a norm per group would synchronise once per group: the per-layer
// gradient and weight norms of the metrics steps). A group's sum equals global_norm(its tensors)^2 before the root.
#pragma once

#include <vector>

#include "ops/op_common.h"

namespace mt::ops {

double global_norm_sq(const Tensor& t);
double global_norm(const std::vector<Tensor>& tensors);
std::vector<double> global_norms_sq(const std::vector<Tensor>& tensors, const std::vector<int>& group, int groups);

}  // namespace mt::ops
