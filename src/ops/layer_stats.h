// Per-layer statistics of the metrics steps (metrics.layer_stats, docs/operations.md "Metric registry"): sums a
// layer adds into f64 slots of the trainer's stat buffer on the tensor's device, so that the trainer reads every
// layer's figures with one device-to-host copy. Each slot group starts with its element count, so every figure is a
// ratio of sums and the sums of several passes, micro-batches and ranks add up.
//   layer_stats_moments: x any shape, contiguous (f32|f64 on CPU; bf16|f16|f32 on CUDA); out [4] f64,
//     out += {numel, sum x, sum x^2, #(x <= low)}   (the activation RMS; the KDA gate's mean and saturation)
//   layer_stats_mix: alpha [N, m] softmax weights, 1 <= m <= kLayerStatsMaxSources (f32|f64 on CPU; f32 on CUDA);
//     out [m + 2] f64,
//     out += {N, sum_n alpha[n, 0], ..., sum_n alpha[n, m - 1], sum_n H_n},  H_n = -sum_j alpha[n, j] ln alpha[n, j]
//     (0 ln 0 = 0)                                                           (the AttnRes mix weights and entropy)
// Both sum in f64 in a fixed order (fixed blocks summed in block order), so the result does not depend on the thread
// count or the run; no host synchronisation.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

// The slots of layer_stats_moments, and the most sources layer_stats_mix takes (attnres_mix's kAttnResMaxSources,
// checked in nn/layer_stats.cpp; the CUDA kernel keeps one register accumulator per source).
constexpr int64_t kLayerStatsMoments = 4;
constexpr int64_t kLayerStatsMaxSources = 32;

void layer_stats_moments(const Tensor& x, double low, const Tensor& out);
void layer_stats_mix(const Tensor& alpha, const Tensor& out);

}  // namespace mt::ops
