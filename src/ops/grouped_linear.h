// Grouped linear (moe.md §1.2 step 3): one GEMM per expert over its contiguous rows, y_r = x_r @ w[e]^T for the rows
// r in [offsets[e], offsets[e+1]). Weights stacked per expert, each [out, in] as in PyTorch.
//   x:       [R, K] f32|f64
//   w:       [E, M, K]
//   offsets: [E + 1] i32, 0 = offsets[0] <= offsets[1] <= ... <= offsets[E] = R (ops/moe_permute.h's plan)
//   y:       [R, M]
// _bwd: dx [R, K] written (=), or accumulated (+=) with accumulate_dx, skipped when undefined; dw [E, M, K]
// accumulates (+=; an empty expert's is unchanged).
// On CUDA (bf16|f16|f32; dw may be f32 with bf16/f16 x) the GEMM shapes are chosen on the host: offsets may be a CPU
// tensor (the MoE layer passes its host copy of the plan's offsets, so there is no synchronisation) or a cuda tensor
// (copied back first: one synchronisation per call).
// The CPU reference is a loop over the non-empty experts calling the linear op's reference, so it equals the
// per-expert loop of linear_fwd / linear_bwd bitwise.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void grouped_linear_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y);
void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx = false);

}  // namespace mt::ops
