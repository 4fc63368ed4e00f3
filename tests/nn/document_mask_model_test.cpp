// Document masking through the whole model (long_context.md §2 and §10 test 2): a packed batch of documents, split
// at the EOT token, gives the loss and every parameter gradient of the documents run one by one, each alone from
// its first token (f64, rho <= 1e-12). The models: the hybrid MoE with Block AttnRes (KDA, attention, MoE), the same
// with window layers (window, global tokens, sink), a dense RoPE model (positions restart per document), and the
// hybrid under recompute, with documents that end mid-chunk, a one-token document and a row's last document without
// an EOT.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

constexpr int32_t kEot = 36;

ModelConfig tiny(const std::string& pattern, bool moe, bool attnres) {
    ModelConfig c;
    c.vocab_size = 37;
    c.d_model = 16;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 64;
    c.init_std = 0.2;
    c.layer_pattern = pattern;
    c.kda.num_heads = 2;
    c.kda.head_dim = 4;
    c.kda.chunk_size = 32;  // documents end mid-chunk and cross the chunk boundary at 32
    if (moe) {
        c.moe_enabled = true;
        c.moe.num_experts = 4;
        c.moe.top_k = 2;
        c.moe.num_shared_experts = 1;
        c.moe.expert_ffn_dim = 8;
    }
    if (attnres) {
        c.attnres.mode = AttnResMode::block;
        c.attnres.block_size = 4;
    }
    c.eot_token = kEot;
    return c;
}

// Row r's document lengths; each document but a row's last ends with the EOT.
const std::vector<std::vector<int64_t>> kDocs = {{7, 12, 1, 20}, {27, 13}};
constexpr int64_t kT = 40;

struct Batch {
    Tensor ids, targets;
};

Batch packed_batch() {
    const int64_t b = static_cast<int64_t>(kDocs.size());
    Batch batch{Tensor::zeros({b, kT}, DType::i32), Tensor::zeros({b, kT}, DType::i32)};
    for (int64_t r = 0; r < b; ++r) {
        int64_t t = 0;
        for (size_t d = 0; d < kDocs[r].size(); ++d)
            for (int64_t i = 0; i < kDocs[r][d]; ++i, ++t) {
                const bool last = i + 1 == kDocs[r][d] && d + 1 < kDocs[r].size();
                const auto id = last ? kEot : static_cast<int32_t>(core::rng_u64(9, r, t) % kEot);
                core::tensor_set_flat(batch.ids, r * kT + t, id);
                // every seventh target ignored: the weights below count supervised tokens, not tokens
                const double target =
                    t % 7 == 4 ? kIgnoreIndex : static_cast<double>(core::rng_u64(9, 7, r * kT + t) % 37);
                core::tensor_set_flat(batch.targets, r * kT + t, target);
            }
    }
    return batch;
}

int64_t counted(const Tensor& targets) {
    int64_t n = 0;
    for (int64_t i = 0; i < targets.numel(); ++i) n += core::tensor_get_flat(targets, i) != kIgnoreIndex ? 1 : 0;
    return n;
}

struct Outcome {
    double loss = 0.0;
    Tensor grads;
};

// The packed batch in one forward and backward with document masking on.
Outcome run_packed(ModelConfig cfg) {
    cfg.document_mask = true;
    Model model(cfg, Precision::cpu(DType::f64));
    model.params().initialize(3);
    model.params().zero_grads();
    const Batch batch = packed_batch();
    Outcome out{model.forward(batch.ids, batch.targets), Tensor()};
    model.backward(1.0);
    out.grads = model.params().grad_arena().clone();
    return out;
}

// Each document alone (batch 1, no masking), its loss and gradient weighted by its share of the supervised tokens.
Outcome run_alone(const ModelConfig& cfg) {
    Model model(cfg, Precision::cpu(DType::f64));
    model.params().initialize(3);
    model.params().zero_grads();
    const Batch batch = packed_batch();
    const double total = static_cast<double>(counted(batch.targets));
    Outcome out;
    for (int64_t r = 0; r < static_cast<int64_t>(kDocs.size()); ++r) {
        int64_t first = 0;
        for (int64_t len : kDocs[r]) {
            auto rows = [&](const Tensor& x) {
                return x.select(0, r).slice(0, first, first + len).clone().reshape({1, len});
            };
            const Tensor targets = rows(batch.targets);
            const double share = static_cast<double>(counted(targets)) / total;
            out.loss += share * model.forward(rows(batch.ids), targets);
            model.backward(share);
            first += len;
        }
    }
    out.grads = model.params().grad_arena().clone();
    return out;
}

struct Case {
    const char* name;
    ModelConfig cfg;
};

class DocumentMaskModel : public ::testing::TestWithParam<Case> {};

TEST_P(DocumentMaskModel, PackedDocumentsEqualEachDocumentAlone) {
    const ModelConfig& cfg = GetParam().cfg;
    const Outcome packed = run_packed(cfg), alone = run_alone(cfg);
    EXPECT_NEAR(packed.loss, alone.loss, 1e-12 * std::abs(alone.loss));
    EXPECT_LE(mt::testing::rho(packed.grads, alone.grads), 1e-12);
    // The masking is what makes them equal: without it the packed batch differs.
    ModelConfig off = cfg;
    off.eot_token = -2;  // no token ends a document: each row is one document
    EXPECT_GT(mt::testing::rho(run_packed(off).grads, alone.grads), 1e-6);
}

ModelConfig with_recompute(ModelConfig c) {
    c.recompute.policy = RecomputePolicy::selective;
    c.recompute.modules = {RecomputeModule::kda, RecomputeModule::attn_core, RecomputeModule::norm};
    return c;
}

ModelConfig dense_rope() {
    ModelConfig c = tiny("A", false, false);
    c.attn_pos = "rope";
    return c;
}

// Window layers (long_context.md §2): the attention layers 2 and 4 of KAKA, a window of 6 (documents longer and
// shorter than it), 2 global tokens (every document sees the same ones, as when run alone), the sink logit and RoPE
// on the window layers, so their positions restart too.
ModelConfig hybrid_window() {
    ModelConfig c = tiny("KAKA", true, true);
    c.attn.window = 6;
    c.attn.window_layers = {2, 4};
    c.attn.global_tokens = 2;
    c.attn.sink_logit = true;
    c.attn.window_rope_base = 10000.0;
    return c;
}

INSTANTIATE_TEST_SUITE_P(Models,
                         DocumentMaskModel,
                         ::testing::Values(Case{"hybrid_moe_attnres", tiny("KKAK", true, true)},
                                           Case{"dense_rope", dense_rope()},
                                           Case{"hybrid_moe_recompute", with_recompute(tiny("KAKK", true, false))},
                                           Case{"hybrid_window_moe_attnres", hybrid_window()}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace mt::nn
