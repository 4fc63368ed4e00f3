// The slot layout of the metrics step's per-layer statistics (nn/layer_stats.h).
#include "nn/layer_stats.h"

#include "nn/layers/attnres.h"
#include "ops/attnres_mix.h"
#include "ops/layer_stats.h"

namespace mt::nn {

static_assert(ops::kLayerStatsMaxSources == ops::kAttnResMaxSources, "every AttnRes mix fits layer_stats_mix");

LayerStatsLayout layer_stats_layout(const ModelConfig& cfg) {
    LayerStatsLayout out;
    out.n_layers = cfg.n_layers;
    out.size = 8 * cfg.n_layers;
    if (cfg.vision.enabled()) {
        out.splice_offset = out.size;
        out.size += 2 * ops::kLayerStatsMoments;
    }
    if (!cfg.attnres.enabled()) return out;
    const int64_t layers = 2 * cfg.n_layers, block = cfg.attnres.resolved_block_size();
    for (int64_t l = 0; l <= layers; ++l) {
        const auto m = static_cast<int64_t>(attnres_sources(l, layers, block).size());
        out.mix_offset.push_back(out.size);
        out.mix_sources.push_back(m);
        out.size += m + 2;
    }
    return out;
}

int layer_stats_param_groups(const ModelConfig& cfg) {
    return static_cast<int>(cfg.n_layers) + (cfg.vision.enabled() ? 2 : 0);
}

double layer_stats_kda_low(const ModelConfig& cfg) {
    return cfg.kda.gate == ops::KdaGateKind::softplus ? -5.0 : 0.99 * cfg.kda.gate_lower_bound;
}

}  // namespace mt::nn
