// Block Attention Residuals mix (../shared/spec/attnres.md §2, §6): per token, a softmax over m sources with a
// learned pseudo-query and an RMSNorm on the keys; the values are the raw sources.
//   r_j[n] = sqrt(mean_c(v_j[n, c]^2) + eps),  s_j[n] = sum_c query[c] * key_gain[c] * v_j[n, c] / r_j[n]
//   alpha[n, :] = softmax_j(s[n, :]),  h[n, :] = sum_j w[n, j] * v_j[n, :],  w = blend / m + (1 - blend) alpha
// blend (the residual blend lambda of §5, in [0, 1]; 0 by default) mixes the plain residual injection (the uniform
// weights 1 / m) into the learned softmax weights; alpha stays the softmax.
//   sources:          m >= 1 tensors [N, C], one dtype (f32|f64 on CPU; bf16|f16|f32 on CUDA)
//   query, key_gain:  [C] (the pseudo-query w and the key RMSNorm gain gamma; any float dtype on CUDA)
//   h:                [N, C], the dtype of the sources
//   alpha:            [N, m] saved for backward (f32 on CUDA, the sources' dtype on CPU)
//   d_sources:        on CUDA f32 or the sources' dtype (all alike), m distinct buffers; dquery, dkey_gain f32 on CUDA
// _bwd recomputes r_j and the logits from the sources: d_sources[j] accumulate (+=; a block is a source of every
// later mix), dquery and dkey_gain accumulate (+=, summed over tokens in a fixed order).
#pragma once

#include <vector>

#include "ops/op_common.h"

namespace mt::ops {

// Most sources one mix takes (the embedding plus up to 31 blocks).
constexpr int64_t kAttnResMaxSources = 32;

void attnres_mix_fwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& h,
                     const Tensor& alpha,
                     double blend = 0.0);
void attnres_mix_bwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& alpha,
                     const Tensor& dh,
                     const std::vector<Tensor>& d_sources,
                     const Tensor& dquery,
                     const Tensor& dkey_gain,
                     double blend = 0.0);

}  // namespace mt::ops
