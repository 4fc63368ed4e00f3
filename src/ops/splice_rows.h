// Splices rows into a sequence of embeddings (multimodal.md §3): the projector's image embeddings replace the
// embeddings of the <img_pad> slots of the LM's token sequence, in place.
//   src:   [M, C] f32|f64 (CUDA: bf16|f16|f32), the dtype of x; M may be 0 (then nothing happens)
//   index: [M] i32 on the device of x: the row of x that row i of src replaces. The entries must be distinct and in
//          [0, N): checked on the CPU for a host tensor; a device tensor is not read back (that would synchronise), so
//          its maker guarantees them (the CUDA kernels skip an entry outside [0, N); with duplicates the result is
//          undefined)
//   x:     [N, C] in/out: x[index[i], :] = src[i, :] for every i < M; every other row of x is left untouched. x must
//          not alias src.
// A pure copy (bitwise). Saves nothing: the backward needs only index.
// _bwd(index, dx, dsrc): dx [N, C] in/out holds, on entry, the gradient of the spliced x; dsrc [M, C] (dx's dtype,
// must not alias dx) is written (=). For every i < M, in this order per row:
//   dsrc[i, :] = dx[index[i], :]   (the gradient of src)
//   dx[index[i], :] = 0            (the rows x held before the splice were overwritten, so they get no gradient:
//                                   the embedding lookup of the placeholder id must not receive any)
// every other row of dx is left untouched (the gradient of x before the splice is the identity there). So after the
// call dx is the gradient of x before the splice.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void splice_rows_fwd(const Tensor& src, const Tensor& index, const Tensor& x);
void splice_rows_bwd(const Tensor& index, const Tensor& dx, const Tensor& dsrc);

}  // namespace mt::ops
