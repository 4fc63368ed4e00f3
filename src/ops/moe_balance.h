// The counting and the auxiliary loss of MoE load balancing (moe.md §2), as ops so that the [N, E] routing scores
// of a GPU run never go to the host: nn::MoeBalancer and nn::MoeLayer call them on the routing tensors' device and
// read the small results back once per step.
//   moe_expert_counts:     counts [E] i64 += the rows per expert of indices [N, K] i32 (every index in [0, E)).
//   moe_qb_histogram:      hist [E, B] i64 += QB's histogram of r_ij = cutoff_i - s_ij over scores [N, E] and
//                          cutoff [N]: bin clamp(floor((r - lower) B / (upper - lower)), 0, B - 1), NaN to bin 0,
//                          computed in double (so the bins depend on the scores' values only, not their dtype).
//   moe_token_entropy_sum: acc [1] f64 += sum over tokens t of H(p_t) / ln E with p_t = s_t / sum_j s_tj
//                          (0 for E = 1), in a fixed order.
//   moe_aux_loss:          returns alpha sum_j f_j P_j (micro-batch scope) with f_j = E count_j / (K N) from indices,
//                          P_j = mean_t p_tj, p_t = s_t / sum_j s_tj (probs = false: sigmoid scores) or s_t (probs =
//                          true: softmax scores); dscores [N, E] (when defined) gets d loss / d scores written (=),
//                          through P only (the counts are not differentiable). One synchronisation on CUDA.
// Token groups (the per-modality counts of multimodal.md §4): moe_expert_counts and moe_qb_histogram take an optional
// group [N] i32 (one id per token of indices / scores); with it only the tokens whose group equals `keep` count.
// Dtypes: scores, cutoff, dscores f32|f64 on the CPU, bf16|f16|f32 on CUDA (one dtype); indices i32; counts,
// hist i64; acc f64. All tensors of a call on one device.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void moe_expert_counts(const Tensor& indices, const Tensor& counts, const Tensor& group = Tensor(), int32_t keep = 0);
void moe_qb_histogram(const Tensor& scores,
                      const Tensor& cutoff,
                      double lower,
                      double upper,
                      const Tensor& hist,
                      const Tensor& group = Tensor(),
                      int32_t keep = 0);
void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc);
double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores);

}  // namespace mt::ops
