// Causal softmax attention with grouped-query heads (GQA): query head h reads key/value head h / (Hq / Hkv).
//   q:   [B, T, Hq, D] f32|f64
//   k,v: [B, T, Hkv, D], Hq % Hkv == 0
//   out: [B, T, Hq, D]
//   lse: [B, Hq, T] saved for backward: log-sum-exp of the scaled scores of each query row
// scores = q k^T / sqrt(D), masked to keys at positions <= the query position.
// _bwd: dq, dk, dv written (=).
#pragma once

#include <string>

#include "ops/op_common.h"

namespace mt::ops {

// The CUDA kernel family: automatic picks wgmma on Hopper and mma.sync elsewhere for bf16 with D 64 or 128 and
// 16-byte aligned tensors, the generic kernels otherwise. A named family falls back where it cannot run: the
// tensor-core ones to generic for other dtypes, head dims or alignments, wgmma to mma before Hopper. The CPU ignores
// it.
enum class AttentionKernel { automatic, wgmma, mma, generic };

// Which CUDA kernels a call runs. The layers keep the defaults; a test or benchmark sets a field to reach a variant.
struct AttentionOptions {
    AttentionKernel kernel = AttentionKernel::automatic;
    // With core::exec().deterministic off, the wgmma backward is the 5-matmul kernel that sums dq with float
    // reductions (the faster one on the H200); false keeps the deterministic kernel anyway. Ignored when on.
    bool fast_bwd = true;
    // When set, the call writes the kernels it ran here (benchmarks print it as their `impl`).
    std::string* chosen = nullptr;
};

void attention_fwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const AttentionOptions& options = {});
void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv,
                   const AttentionOptions& options = {});

}  // namespace mt::ops
