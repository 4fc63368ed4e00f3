// The LM head and loss in token chunks (loss.chunk_tokens, long_context.md §5 and §10 test 4): the chunked model's
// loss and every gradient equal the unchunked model's (rho <= 1e-6 in f32, <= 1e-12 in f64: the same per-row
// arithmetic, the head's weight gradient summed chunk by chunk), with ignored targets inside the chunks, uneven last
// chunks and a chunk of one row; and the logits buffer holds one chunk, never [N, V].
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

ModelConfig tiny(const std::string& pattern, bool moe, bool attnres) {
    ModelConfig c;
    c.vocab_size = 37;
    c.d_model = 16;
    c.n_layers = 4;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.d_ff = 24;
    c.max_seq_len = 48;
    c.init_std = 0.2;
    c.tie_embeddings = !moe;  // the tied head: its gradient sums the embedding's and every chunk's
    c.layer_pattern = pattern;
    c.kda.num_heads = 2;
    c.kda.num_v_heads = 2;
    c.kda.head_dim = 4;
    c.kda.head_v_dim = 4;
    c.kda.chunk_size = 32;
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
    return c;
}

struct Outcome {
    double loss = 0.0;
    Tensor grads;
    int64_t logits_rows = 0;
};

// One forward and backward over 2 x 40 tokens, every fifth target ignored.
Outcome run(ModelConfig cfg, int64_t chunk, const Precision& precision) {
    cfg.loss_chunk_tokens = chunk;
    Model model(cfg, precision);
    model.params().initialize(3);
    model.params().zero_grads();
    const int64_t b = 2, t = 40;
    Tensor ids = Tensor::zeros({b, t}, DType::i32), targets = Tensor::zeros({b, t}, DType::i32);
    for (int64_t i = 0; i < ids.numel(); ++i) {
        core::tensor_set_flat(ids, i, static_cast<double>(core::rng_u64(5, 0, i) % cfg.vocab_size));
        core::tensor_set_flat(
            targets, i, i % 5 == 3 ? kIgnoreIndex : static_cast<double>(core::rng_u64(5, 1, i) % cfg.vocab_size));
    }
    Outcome out;
    out.loss = model.forward(ids, targets);
    for (const SavedTensor& s : model.saved_for_backward())
        if (s.name == "logits") out.logits_rows = s.tensor->size(0);
    model.backward(1.0);
    out.grads = model.params().grad_arena().to_device(core::Device::cpu);
    return out;
}

Outcome run(ModelConfig cfg, int64_t chunk, DType dtype) {
    return run(std::move(cfg), chunk, Precision::cpu(dtype));
}

struct Case {
    const char* name;
    ModelConfig cfg;
};

void PrintTo(const Case& c, std::ostream* os) {
    *os << c.name;
}

class ChunkedLoss : public ::testing::TestWithParam<Case> {};

TEST_P(ChunkedLoss, EqualsTheUnchunkedLossAndGradients) {
    for (DType dtype : {DType::f32, DType::f64}) {
        const double tol = dtype == DType::f32 ? 1e-6 : 1e-12;
        const Outcome whole = run(GetParam().cfg, 0, dtype);
        ASSERT_EQ(whole.logits_rows, 80);
        ASSERT_GT(whole.loss, 0.0);  // something to compare: a loss and a gradient arena
        ASSERT_GT(whole.grads.numel(), 0);
        for (int64_t chunk : {1, 7, 32, 79}) {  // 80 rows: 80 chunks, uneven 7s and 32s, one row left over
            SCOPED_TRACE(::testing::Message() << core::dtype_name(dtype) << " chunk " << chunk);
            const Outcome c = run(GetParam().cfg, chunk, dtype);
            EXPECT_EQ(c.logits_rows, chunk);  // the buffer holds one chunk
            EXPECT_LE(std::abs(c.loss - whole.loss), tol * std::abs(whole.loss));
            const double r = mt::testing::rho(c.grads, whole.grads);
            EXPECT_LE(r, tol);
        }
        // A chunk at least as large as the batch is one chunk: the same bytes as unchunked.
        const Outcome big = run(GetParam().cfg, 80, dtype);
        EXPECT_EQ(big.logits_rows, 80);
        EXPECT_EQ(big.loss, whole.loss);
        EXPECT_EQ(std::memcmp(big.grads.raw(), whole.grads.raw(), whole.grads.nbytes()), 0);
    }
}

INSTANTIATE_TEST_SUITE_P(Models,
                         ChunkedLoss,
                         ::testing::Values(Case{"dense", tiny("A", false, false)},
                                           Case{"hybrid", tiny("KKKA", false, false)},
                                           Case{"moe_attnres", tiny("KKKA", true, true)}),
                         [](const auto& info) { return std::string(info.param.name); });

// The same on the GPU, where the chunks are row slices of the CUDA ops' operands: f32 to 1e-5 (the GEMMs may tile
// a chunk differently from the whole), bf16 mixed precision to bf16 rounding.
TEST(GpuChunkedLoss, EqualsTheUnchunkedLossAndGradients) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device";
    for (const auto& [precision, tol] : {std::pair{Precision::cuda_f32(), 1e-5}, {Precision::cuda_bf16(), 2e-2}}) {
        SCOPED_TRACE(::testing::Message() << core::dtype_name(precision.compute));
        const ModelConfig cfg = tiny("KKKA", true, true);
        const Outcome whole = run(cfg, 0, precision), c = run(cfg, 32, precision);
        ASSERT_GT(whole.loss, 0.0);
        EXPECT_EQ(c.logits_rows, 32);
        EXPECT_LE(std::abs(c.loss - whole.loss), tol * whole.loss);
        EXPECT_LE(mt::testing::rho(c.grads, whole.grads), tol);
    }
}

}  // namespace
}  // namespace mt::nn
