// Grouped linear (moe.md §1.2 step 3): one GEMM per expert over its contiguous rows, y_r = x_r @ w[e]^T for the rows
// r in [offsets[e], offsets[e+1]). Weights stacked per expert, each [out, in] as in PyTorch.
//   x:       [R, K] f32|f64
//   w:       [E, M, K]
//   offsets: [E + 1] i32, 0 = offsets[0] <= offsets[1] <= ... <= offsets[E] = R (ops/moe_permute.h's plan)
//   y:       [R, M]
// _bwd: dx [R, K] written (=), or accumulated (+=) with accumulate_dx, skipped when undefined; dw [E, M, K]
// accumulates (+=; an empty expert's is unchanged), or is written (=; an empty expert's set to zero) with
// accumulate_dw false (the step's first gradient, as linear_bwd's), skipped when undefined (one of the two must be
// given: the MoE layer may run dx on one implementation and dw on the other).
// On CUDA (bf16|f16|f32; dw may be f32 with bf16/f16 x) two implementations (impl, GroupedGemm below):
//   device:   one kernel launch per product for all experts, reading offsets on the device (a cuda tensor: no host
//             copy, no synchronisation; gemm/grouped_gemm_sm90.cu). bf16 x with bf16|f32 dw, K and M multiples of 8,
//             16-byte aligned tensors, an sm_90 GPU (grouped_linear_device_why_not). Device offsets are not checked
//             on the host (that would synchronise): the kernels clamp them to [0, R], the caller keeps them valid.
//   cublaslt: one cuBLASLt GEMM per non-empty expert, with the shapes chosen on the host: offsets a CPU tensor (the
//             MoE layer's host copy of the plan's offsets) or a cuda tensor (copied back: one synchronisation).
// The CPU reference is a loop over the non-empty experts calling the linear op's reference, so it equals the
// per-expert loop of linear_fwd / linear_bwd bitwise; it ignores impl.
#pragma once

#include <string>

#include "ops/op_common.h"

namespace mt::ops {

// Which CUDA implementation runs (moe.grouped_gemm): automatic takes the device kernel when offsets are a cuda tensor
// and the kernel takes the call, cuBLASLt otherwise; device requires the device kernel (fails naming why not);
// cublaslt always takes cuBLASLt.
enum class GroupedGemm { automatic, device, cublaslt };

void grouped_linear_fwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets,
                        const Tensor& y,
                        GroupedGemm impl = GroupedGemm::automatic);
void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx = false,
                        GroupedGemm impl = GroupedGemm::automatic,
                        bool accumulate_dw = true);

// Empty when the device kernel takes x of dtype x, dw of dtype dw (x's for the forward), K and M on this machine's
// GPU (alignment aside: the entry points check the tensors' addresses); otherwise why not. The MoE layer asks it to
// decide whether to keep a host copy of the plan's offsets.
std::string grouped_linear_device_why_not(DType x, DType dw, int64_t k, int64_t m);

}  // namespace mt::ops
