// The grouped GEMM of gemm/grouped_gemm_sm90.cu: the three products of the grouped linear op (ops/grouped_linear.h)
// in one launch each, with the plan's offsets [E + 1] i32 read on the device. Shapes and dtypes are checked by the
// op's entry point; grouped_gemm_sm90_why_not says whether the kernels take them.
#pragma once

#include <string>

#include "ops/op_common.h"

namespace mt::ops::cuda {

// Empty where the kernels take x of dtype x, dw of dtype dw (x's dtype for the forward) and K, M on this GPU;
// otherwise why not (bf16 x, bf16|f32 dw, K and M positive multiples of 8, an sm_90 GPU with an sm_90a build).
std::string grouped_gemm_sm90_why_not(DType x, DType dw, int64_t k, int64_t m);
// As grouped_linear_fwd / grouped_linear_bwd, offsets a cuda tensor; every pointer 16-byte aligned.
void grouped_gemm_sm90_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y);
void grouped_gemm_sm90_bwd(const Tensor& x,
                           const Tensor& w,
                           const Tensor& offsets,
                           const Tensor& dy,
                           const Tensor& dx,
                           const Tensor& dw,
                           bool accumulate_dx,
                           bool accumulate_dw);

}  // namespace mt::ops::cuda
