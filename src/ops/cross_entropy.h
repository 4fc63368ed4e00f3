// Fused softmax + cross-entropy over the vocabulary, per row.
//   logits:  [N, V] f32|f64
//   targets: [N] i32; a row whose target equals ignore_index is ignored (loss 0, gradient 0);
//            any other target outside [0, V) is an input-data error (exit 3)
//   losses:  [N] written: lse - logits[target] (0 for ignored rows)
//   lse:     [N] saved for backward: log-sum-exp of the row
// _bwd: dlogits[n, :] = dlosses[n] * (softmax(logits[n]) - onehot(target[n])), written (=).
//       dlogits may alias logits (the fused, in-place form that never keeps both).
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

void cross_entropy_fwd(
    const Tensor& logits, const Tensor& targets, int32_t ignore_index, const Tensor& losses, const Tensor& lse);
void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits);

}  // namespace mt::ops
