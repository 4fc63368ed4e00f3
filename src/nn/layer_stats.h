// Where the per-layer statistics of a metrics step (metrics.layer_stats) live in the trainer's f64 slot buffer, a
// function of the model config only, so that the trainer, the layers and the tests agree on it without the model.
// Each group starts with its element count (ops/layer_stats.h), so every figure is a ratio of sums over passes,
// micro-batches and ranks:
//   layer l:  act(l)      [4] the residual stream after the layer: {numel, sum, sum of squares, -}
//             kda_gate(l) [4] a KDA layer's log decay g: {numel, sum, -, #(g at the lower bound)}
//   mix l of Block AttnRes (l = 0..2 n_layers, the last one the final mix): mix(l) [m_l + 2]
//             {tokens, sum of alpha per source (m_l), sum of the entropy of alpha}
//   the image splice (vision enabled, multimodal.md §8): splice() [8] the projector's outputs {numel, sum, sum of
//             squares, -}, then the embedding rows after the splice, image and text together, the same four
#pragma once

#include <cstdint>
#include <vector>

#include "nn/model_config.h"

namespace mt::nn {

struct LayerStatsLayout {
    int64_t n_layers = 0;
    std::vector<int64_t> mix_offset, mix_sources;  // per AttnRes mix; empty without AttnRes
    int64_t splice_offset = -1;                    // the image splice's 8 slots; -1 without a vision encoder
    int64_t size = 0;                              // slots in all

    int64_t act(int64_t l) const {
        return 8 * l;
    }
    int64_t kda_gate(int64_t l) const {
        return 8 * l + 4;
    }
    int64_t mix(int64_t l) const {
        return mix_offset[static_cast<size_t>(l)];
    }
    int64_t splice() const {
        return splice_offset;
    }
};

LayerStatsLayout layer_stats_layout(const ModelConfig& cfg);
// The parameter groups of the per-group norms (gradient, weight, update): the layers, then the vision encoder and the
// projector where the model has them.
int layer_stats_param_groups(const ModelConfig& cfg);

// The saturation threshold of the KDA gate (kda.md §7): a log decay within 1% of the lower bound l counts as
// saturated (g <= 0.99 l); for the unbounded softplus gate, g <= -5 (a decay below e^-5 per token).
double layer_stats_kda_low(const ModelConfig& cfg);

}  // namespace mt::nn
