// Causal softmax attention with grouped-query heads (GQA): query head h reads key/value head h / (Hq / Hkv).
//   q:   [B, T, Hq, D] f32|f64
//   k,v: [B, T, Hkv, D], Hq % Hkv == 0
//   out: [B, T, Hq, D]
//   lse: [B, Hq, T] saved for backward: log-sum-exp of the scaled scores of each query row
// scores = q k^T / sqrt(D), masked to keys at positions <= the query position.
// _bwd: dq, dk, dv written (=).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv);

}  // namespace mt::ops
