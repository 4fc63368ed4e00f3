// CUDA side of the Block AttnRes mix (ops/attnres_mix.h); shapes are checked by the entry point. Sources bf16, f16 or
// f32 (one dtype; h and d_sources the same); query, key_gain, alpha, dquery, dkey_gain f32. Declared apart from
// cuda_ops.h so the AttnRes files stay together; attnres_mix_stub.cpp answers in builds without nvcc.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt::ops::cuda {

void attnres_mix_fwd(const std::vector<core::Tensor>& sources,
                     const core::Tensor& query,
                     const core::Tensor& key_gain,
                     double eps,
                     const core::Tensor& h,
                     const core::Tensor& alpha,
                     double blend);
void attnres_mix_bwd(const std::vector<core::Tensor>& sources,
                     const core::Tensor& query,
                     const core::Tensor& key_gain,
                     double eps,
                     const core::Tensor& alpha,
                     const core::Tensor& dh,
                     const std::vector<core::Tensor>& d_sources,
                     const core::Tensor& dquery,
                     const core::Tensor& dkey_gain,
                     double blend);

}  // namespace mt::ops::cuda
