// Global (memory) tokens and a sink logit for softmax attention (long_context.md §2): g keys and values shared by
// every query of a layer, and a per-head logit added to every softmax denominator, merged into the result of
// ops::attention_fwd over the local keys (the causal, document and window mask), which stays the only O(n w) part.
// Attention over a union of key sets is the log-sum-exp merge of attention over each set, so they need no place in
// the flash kernels' tiles.
//   q:        [B, T, Hq, D]
//   kg, vg:   [G, Hkv, D] the global tokens' keys and values (query head h reads kv head h / (Hq / Hkv)); G >= 1
//             when defined; both undefined: no global tokens
//   sink:     [Hq] the sink logits b_h, or undefined (no sink)
//   out, lse: [B, T, Hq, D] and [B, Hq, T], in: attention over the local keys; out: over the local keys, the global
//             keys and the sink (updated in place)
// With s_j = q . kg_j / sqrt(D) (no position encoding: global keys are never rotated):
//   lse' = log(exp(lse) + sum_j exp(s_j) + exp(b_h));  out' = exp(lse - lse') out + sum_j exp(s_j - lse') vg_j
// _bwd runs after ops::attention_bwd was given the merged out' and lse', which makes that op's dq, dk and dv exact
// for the local keys (its probabilities are exp(s - lse') and its row term dout . out'). It adds the global keys' and
// the sink's terms, with p_j = exp(s_j - lse'), delta = dout . out' and ds_j = p_j (dout . vg_j - delta):
//   dq += sum_j ds_j kg_j / sqrt(D)                 (accumulated, +=)
//   dkg = sum over queries of ds_j q / sqrt(D); dvg = sum over queries of p_j dout   (written, =)
//   dsink[h] += -sum over queries of exp(b_h - lse') delta                           (accumulated, +=)
// Dtypes: the CPU takes f32|f64 throughout (lse too). CUDA: q, kg, vg, out, dout, dq, dkg, dvg bf16|f16|f32 alike,
// lse f32, sink and dsink in the dtype of q or f32. The sums over queries are in a fixed order (deterministic).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void attention_global_fwd(
    const Tensor& q, const Tensor& kg, const Tensor& vg, const Tensor& sink, const Tensor& out, const Tensor& lse);
void attention_global_bwd(const Tensor& q,
                          const Tensor& kg,
                          const Tensor& vg,
                          const Tensor& sink,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& dout,
                          const Tensor& dq,
                          const Tensor& dkg,
                          const Tensor& dvg,
                          const Tensor& dsink);

}  // namespace mt::ops
