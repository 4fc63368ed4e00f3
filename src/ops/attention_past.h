// Softmax attention of queries over a block of keys that lies wholly in their past, merged into a running result by
// log-sum-exp (long_context.md §7, ring context parallelism): each step of the ring brings a key/value shard that sits
// before every query reading it, so no causal mask applies inside the step, only the documents'. Attention over a
// union of key sets is the log-sum-exp merge of attention over each set (as ops/attention_global.h merges the global
// tokens), so the ring's steps add up to the attention over every key.
//   q:         [B, T, Hq, D]
//   k, v:      [B, Tk, Hkv, D], Hq % Hkv == 0 (query head h reads kv head h / (Hq / Hkv))
//   first:     [B, T] i32, each query's first visible key of the block in [0, Tk] (its document's start; Tk: none
//              of the block), or undefined: every key
//   out, lse:  [B, T, Hq, D] and [B, Hq, T]; in: the result over the keys merged so far (lse = -inf and out = 0 for
//              none yet); out: merged with this block's visible keys (in place)
//   max_logit: [B, Hq, T] or undefined: the running largest scaled score (as attention_fwd's), updated in place
// With s_j = q . k_j / sqrt(D) over the visible keys j:
//   lse' = log(exp(lse) + sum_j exp(s_j));  out' = exp(lse - lse') out + sum_j exp(s_j - lse') v_j
// A row that sees no key of the block keeps its out and lse.
// _bwd takes the final out and lse (merged over every block: attention_bwd and attention_global_bwd take the same),
// with which a block's terms are exact: p_j = exp(s_j - lse), delta = dout . out, ds_j = p_j (dout . v_j - delta):
//   dq += sum_j ds_j k_j / sqrt(D)   (accumulated, +=)
//   dk_j = sum over queries of ds_j q / sqrt(D);  dv_j = sum over queries of p_j dout   (written, =)
// CPU only, f32|f64 throughout (context parallelism runs on the CPU; a CUDA call fails: not implemented). The sums over
// queries run per kv head in a fixed order (deterministic at any thread count).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void attention_past_fwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& max_logit = Tensor());
void attention_past_bwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& dout,
                        const Tensor& dq,
                        const Tensor& dk,
                        const Tensor& dv);

}  // namespace mt::ops
