// Fused softmax + cross-entropy over the vocabulary, per row.
//   logits:  [N, V] f32|f64
//   targets: [N] i32; a row whose target equals ignore_index is ignored (loss 0, gradient 0);
//            any other target outside [0, V) (outside [0, shard.total) when sharded) is an input-data error (exit 3)
//   losses:  [N] written: lse - logits[target] (0 for ignored rows)
//   lse:     [N] saved for backward: log-sum-exp of the row
// _bwd: dlogits[n, :] = dlosses[n] * (softmax(logits[n]) - onehot(target[n])), written (=).
//       dlogits may alias logits (the fused, in-place form that never keeps both).
//
// Sharded (vocab-parallel loss, ops/op_common.h VocabShard): logits holds the columns of the ids [first, first + V)
// and the targets are global ids. _fwd writes each shard's partial results:
//   lse:     [N] the log-sum-exp of the shard's own columns
//   losses:  [N] the target's logit logits[n, t - first] where the target t lies in the shard, else 0 (0 for ignored
//            rows)
// The caller combines the R shards (an all-reduce over the tensor-parallel group):
//   lse_n = log sum_r exp(lse_r[n]),  loss_n = lse_n - sum_r losses_r[n]  (ignored rows: loss 0)
// _bwd takes that combined lse (the whole vocabulary's) and writes the shard's columns of the whole gradient:
//   dlogits[n, j] = dlosses[n] * (exp(logits[n, j] - lse[n]) - [j == t - first]), the one-hot term only where the
//   target lies in the shard; 0 for ignored rows. dlogits may alias logits as above.
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

// The targets' check of the CPU kernels on host targets [N] i32: each in [0, range) or ignore_index, else exit 3
// naming op, the position and the target (the CUDA kernels check on the device and report the same message).
void check_cross_entropy_targets(const Tensor& targets, int64_t range, int32_t ignore_index, std::string_view op);

void cross_entropy_fwd(const Tensor& logits,
                       const Tensor& targets,
                       int32_t ignore_index,
                       const Tensor& losses,
                       const Tensor& lse,
                       const VocabShard& shard = {});
void cross_entropy_bwd(const Tensor& logits,
                       const Tensor& targets,
                       const Tensor& lse,
                       int32_t ignore_index,
                       const Tensor& dlosses,
                       const Tensor& dlogits,
                       const VocabShard& shard = {});

}  // namespace mt::ops
