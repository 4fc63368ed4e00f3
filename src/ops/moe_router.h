// MoE router (moe.md §1.1, §1.4): scores from the router logits, top-k selection on score + bias, gates from the
// unbiased scores. The router GEMM z = x W_r^T is a plain linear op before this one.
//   logits:  [N, E] f32|f64        z
//   bias:    [E] (dtype of logits) the balancing bias b, or undefined (zero); it affects the selection only. With
//            bias_rows: [G, E], one bias per token group (the per-modality bias, multimodal.md §4)
//   bias_rows: [N] i32 or undefined: token i selects on s_i + bias[bias_rows[i]], each in [0, G)
//   scores:  [N, E]                s = sigmoid(z), or softmax(z) over E with MoeScore::softmax
//   indices: [N, K] i32            I = TopK(s + b, K), descending, ties by the lower expert index
//   gates:   [N, K]                g_q = scale * s_{I_q} / (sum_{q'} s_{I_q'} + 1e-20) (normalize), else scale *
//   s_{I_q} cutoff:  [N] or undefined      the (K+1)-th largest s + b (Quantile Balancing's cutoff, moe.md §2.1); needs
//   E > K
// _bwd: saves scores, indices, gates (the forward's outputs). dgates [N, K]; dscores [N, E] or undefined is an extra
// gradient on the scores (the aux loss, §2.3); dlogits [N, E] is written (=). The bias gets no gradient.
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

enum class MoeScore { sigmoid, softmax };

struct MoeRouterOptions {
    int64_t top_k = 1;
    MoeScore score = MoeScore::sigmoid;
    bool normalize = true;  // normalise the gates over the selected experts
    double scale = 1.0;     // rho, moe.routed_scale
};

void moe_router_fwd(const Tensor& logits,
                    const Tensor& bias,
                    const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& cutoff,
                    const MoeRouterOptions& options,
                    const Tensor& bias_rows = Tensor());
void moe_router_bwd(const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& dgates,
                    const Tensor& dscores,
                    const Tensor& dlogits,
                    const MoeRouterOptions& options);

}  // namespace mt::ops
