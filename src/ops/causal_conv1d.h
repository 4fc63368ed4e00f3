// Causal depthwise 1-D convolution over time, optionally followed by SiLU (the short conv of KDA, kda.md §1):
//   y[b, t, c] = act(sum_{tau < W} w[c, tau] x[b, t - W + 1 + tau, c]),  positions before t = 0 read zero
// so tap W - 1 multiplies the current token. act = SiLU (z sigmoid(z)) when silu, identity otherwise.
//   x, y: [B, T, C] f32|f64;  w: [C, W] (PyTorch's Conv1d weight [C, 1, W] without the middle dim), no bias
// Saves nothing beyond its inputs (the backward recomputes the pre-activation).
// _bwd: dx written (=); dw accumulates (+=, a parameter grad), summed over (b, t) in a fixed order.
// doc_start: a [B, T] i32 document-start map (ops/attention.h AttentionMask): positions before a token's document
// start read zero as those before t = 0 do, so no document sees another's rows (the halo resets at every document).
// Undefined: one document per row. On the GPU the map is a device tensor.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void causal_conv1d_fwd(
    const Tensor& x, const Tensor& w, const Tensor& y, bool silu, const Tensor& doc_start = Tensor());
void causal_conv1d_bwd(const Tensor& x,
                       const Tensor& w,
                       const Tensor& dy,
                       const Tensor& dx,
                       const Tensor& dw,
                       bool silu,
                       const Tensor& doc_start = Tensor());

}  // namespace mt::ops
