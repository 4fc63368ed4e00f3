// What the GPU attention parity tests ask of the machine they run on: a CUDA device, and whether the automatic
// kernel choice runs wgmma there (a Hopper GPU).
#pragma once

#include <string>

#include "core/backend.h"
#include "ops/attention.h"

namespace mt::ops::test {

inline bool attention_gpu_here() {
    return core::backend_available(core::Device::cuda);
}

inline bool attention_wgmma_here() {
    const Tensor q = Tensor::zeros({1, 16, 1, 64}, core::DType::bf16, core::Device::cuda);
    const Tensor out = Tensor::zeros(q.shape(), core::DType::bf16, core::Device::cuda);
    const Tensor lse = Tensor::zeros({1, 1, 16}, core::DType::f32, core::Device::cuda);
    std::string chosen;
    AttentionOptions options;
    options.chosen = &chosen;
    attention_fwd(q, q, q, out, lse, options);
    return chosen == "cuda-wgmma";
}

}  // namespace mt::ops::test
