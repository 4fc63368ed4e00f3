// The MoE balancer's and metrics' device counting, called by nn/moe_balance.cpp and nn/moe_metrics.cpp until the
// restructure makes MoE balancing an op of its own (ops/moe_balance.h, docs/ARCHITECTURE.md); defined in
// moe_balance.cu, or failing with exit 5 in a build without nvcc (moe_balance_stub.cpp).
#pragma once

#include "ops/op_common.h"

namespace mt::ops::cuda {

// counts [E] i64 += rows per expert of indices [N, K] i32 (integer atomics: exact in any order).
void moe_expert_counts(const Tensor& indices, const Tensor& counts);
// hist [E, B] i64 += QB's histogram of r = cutoff_i - s_ij (bins in double exactly as MoeBalancer's CPU path).
void moe_qb_histogram(const Tensor& scores, const Tensor& cutoff, double lower, double upper, const Tensor& hist);
// acc [1] f64 += sum over tokens of H(s_t / sum s_t) / ln E, in a fixed order.
void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc);
// The micro-batch aux loss of nn::moe_aux_loss (one synchronisation: the loss comes back to the host).
double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores);

}  // namespace mt::ops::cuda
