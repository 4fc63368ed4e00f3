// Row-wise argmax: the greedy prediction of the LM head, which the shapes controls read for exact match
// (multimodal.md §6: under teacher forcing, every supervised argmax equal to its target is exactly "greedy decoding
// reproduces the caption").
//   x:   [N, V] f32|f64 (CUDA: bf16|f16|f32, compared in f32, which holds bf16 and f16 exactly), V >= 1
//   out: [N] i32, written: the smallest j with x[n, j] = max_k x[n, k], the first maximum as torch.argmax. NaN is
//        never the maximum (torch.argmax picks a NaN): a row of NaNs, or of NaNs and -inf, gives 0.
// No backward: the argmax is piecewise constant.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void argmax_rows(const Tensor& x, const Tensor& out);

}  // namespace mt::ops
