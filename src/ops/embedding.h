// Token embedding lookup.
//   ids:    [N] i32, each in [0, V) (in [0, shard.total) when sharded)
//   weight: [V, C] f32|f64
//   out:    [N, C] same dtype as weight
// _fwd saves nothing beyond its inputs (ids). _bwd accumulates (+=) into dweight.
// An id outside [0, V) is an input-data error (exit 3) naming the position and the id.
// Sharded (vocab-parallel embedding, ops/op_common.h VocabShard): weight holds the rows of the ids
// [first, first + V); the ids are global. A row whose id lies outside the shard is written as zeros (summing the
// shards' outputs gives the whole table's lookup), and _bwd accumulates only the in-shard ids, into row id - first.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void embedding_fwd(const Tensor& ids, const Tensor& weight, const Tensor& out, const VocabShard& shard = {});
// The ids' check of the CPU kernels on host ids [N] i32: each in [0, range), else exit 3 naming op, the position
// and the id (the CUDA kernels check on the device and report the same message). A caller that checks its ids on
// the host this way may run the CUDA kernels under core::ExecCtx::indices_checked.
void check_embedding_ids(const Tensor& ids, int64_t range, std::string_view op);
void embedding_bwd(const Tensor& ids, const Tensor& dout, const Tensor& dweight, const VocabShard& shard = {});

}  // namespace mt::ops
