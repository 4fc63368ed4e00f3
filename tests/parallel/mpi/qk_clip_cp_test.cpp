// QK-clip's per-head max logit under context parallelism (muon.md §4 step 1; long_context.md §7), under mpirun: the
// world as one cp group, every rank running its zigzag share of the batch, each attention layer's per-head maxima
// (global and window layers; all-gather and ring) equal one process's, are the same on every rank (so are the clip
// factors), and max_logit is their maximum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "parallel/comm.h"
#include "parallel/runtime.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;
using parallel::dist_world;

// Two attention layers, the second a window layer (w = 20, two global tokens), RoPE on both, GQA 4 / 2.
ModelConfig tiny_attention() {
    ModelConfig c;
    c.vocab_size = 37;
    c.d_model = 16;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 512;
    c.init_std = 0.2;
    c.attn_pos = "rope";
    c.attn.window = 20;
    c.attn.window_layers = {2};
    c.attn.global_tokens = 2;
    c.attn.window_rope_base = 10000.0;
    return c;
}

// Per attention layer, its per-head maxima and max_logit after one tracked forward.
struct Maxima {
    std::vector<std::vector<double>> heads;
    std::vector<double> scalar;
};

Maxima run(int64_t cp, CpAttnMode attn) {
    const int64_t b = 2, t = parallel::cp_granularity(dist_world().size());
    auto self = parallel::comm_make_self();
    parallel::Comm& group = cp > 1 ? dist_world() : *self;
    const ContextParallel ctx{.size = cp, .rank = group.rank(), .attn = attn, .kda = CpKdaMode::affine, .comm = &group};
    Model model(tiny_attention(), Precision::cpu(DType::f64), 64, {}, {}, {}, ctx);
    model.params().initialize(7);
    model.set_track_max_logit(true);
    Tensor ids = Tensor::zeros({b, t}, DType::i32), targets = Tensor::zeros({b, t}, DType::i32);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        core::tensor_set_flat(ids, i, static_cast<double>(core::rng_u64(5, 0, i) % 37));
        core::tensor_set_flat(targets, i, static_cast<double>(core::rng_u64(5, 1, i) % 37));
    }
    model.forward(ids, targets);
    Maxima m;
    for (int64_t l = 0; l < 2; ++l) {
        AttentionLayer* a = model.block_at(l).attention();
        m.heads.push_back(a->head_max_logit());
        m.scalar.push_back(a->max_logit());
    }
    return m;
}

TEST(QkClipCp, PerHeadMaximaEqualOneProcessOnEveryRank) {
    const Maxima one = run(1, CpAttnMode::allgather);
    for (CpAttnMode mode : {CpAttnMode::allgather, CpAttnMode::ring}) {
        SCOPED_TRACE(enum_name(mode));
        const Maxima cp = run(dist_world().size(), mode);
        for (size_t l = 0; l < 2; ++l) {
            ASSERT_EQ(cp.heads[l].size(), 4u);
            for (size_t h = 0; h < 4; ++h) {
                EXPECT_TRUE(std::isfinite(one.heads[l][h]));
                EXPECT_NEAR(cp.heads[l][h], one.heads[l][h], 1e-12 * std::abs(one.heads[l][h])) << l << " " << h;
            }
            EXPECT_EQ(cp.scalar[l], *std::max_element(cp.heads[l].begin(), cp.heads[l].end())) << l;
            // The same bits on every rank: rank 0's maxima, broadcast, against each rank's own.
            std::vector<double> root = cp.heads[l];
            dist_world().broadcast(root.data(), 4, parallel::CommType::f64, 0).wait();
            EXPECT_EQ(root, cp.heads[l]) << l;
        }
    }
}

}  // namespace
}  // namespace mt::nn
