// Whole dense LM in f64: finite-difference gradient check of every parameter tensor, and the layer contract.
#include "nn/dense_lm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

using mt::core::DType;
using mt::core::Tensor;
using mt::nn::DenseLM;
using mt::nn::ModelConfig;

namespace {

ModelConfig small_config(bool tied) {
    ModelConfig c;
    c.vocab_size = 23;
    c.d_model = 12;
    c.n_layers = 2;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.d_ff = 20;
    c.max_seq_len = 16;
    c.tie_embeddings = tied;
    c.init_std = 0.3;  // large enough that every path carries gradient
    return c;
}

void random_batch(const Tensor& ids, const Tensor& targets, int64_t vocab) {
    for (int64_t i = 0; i < ids.numel(); ++i) {
        mt::core::tensor_set_flat(ids, i, static_cast<double>(mt::core::rng_u64(5, 1, i) % vocab));
        mt::core::tensor_set_flat(targets, i, static_cast<double>(mt::core::rng_u64(5, 2, i) % vocab));
    }
    mt::core::tensor_set_flat(targets, 3, mt::nn::kIgnoreIndex);
}

}  // namespace

class DenseLmGrad : public ::testing::TestWithParam<bool> {};

TEST_P(DenseLmGrad, FiniteDifferencesMatchBackward) {
    DenseLM model(small_config(GetParam()), mt::nn::Precision::cpu(DType::f64));
    model.params().initialize(11);
    // Norm weights start at 1; perturb them so their gradients are generic.
    for (int i = 0; i < model.params().size(); ++i)
        if (model.params().spec(i).shape.size() == 1)
            mt::core::rng_fill_uniform(model.params().param(i), 3, static_cast<uint64_t>(i), 0.5, 1.5);
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);

    model.params().zero_grads();
    model.forward(ids, targets);
    model.backward(1.0);
    const Tensor grads = model.params().grad_arena().clone();

    for (int p = 0; p < model.params().size(); ++p) {
        const Tensor w = model.params().param(p);
        const int64_t base = model.params().offset(p);
        for (int k = 0; k < 4; ++k) {
            const int64_t i = static_cast<int64_t>(mt::core::rng_u64(9, static_cast<uint64_t>(p), k) % w.numel());
            const double x = mt::core::tensor_get_flat(w, i);
            const double h = 1e-6 * std::max(1.0, std::abs(x));
            mt::core::tensor_set_flat(w, i, x + h);
            const double up = model.forward(ids, targets);
            mt::core::tensor_set_flat(w, i, x - h);
            const double down = model.forward(ids, targets);
            mt::core::tensor_set_flat(w, i, x);
            const double numeric = (up - down) / (2 * h);
            const double analytic = mt::core::tensor_get_flat(grads, base + i);
            const double err = std::abs(numeric - analytic) / std::max(1e-6, std::abs(numeric) + std::abs(analytic));
            EXPECT_LT(err, 1e-6) << model.params().spec(p).name << "[" << i << "] numeric " << numeric << " analytic "
                                 << analytic;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, DenseLmGrad, ::testing::Values(true, false));

TEST(DenseLm, ParameterNamesAndSavedActivations) {
    DenseLM model(small_config(false), mt::nn::Precision::cpu(DType::f32));
    const auto& t = model.params();
    EXPECT_GE(t.find("embed.weight"), 0);
    EXPECT_GE(t.find("layers.1.attn.wk.weight"), 0);
    EXPECT_GE(t.find("layers.0.mlp.w_down.weight"), 0);
    EXPECT_GE(t.find("lm_head.weight"), 0);
    EXPECT_EQ(t.spec(t.find("layers.1.attn.wk.weight")).shape, (mt::core::Shape{4, 12}));
    EXPECT_FALSE(t.spec(t.find("final_norm.weight")).weight_decay);
    Tensor ids = Tensor::zeros({2, 7}, DType::i32), targets = Tensor::zeros({2, 7}, DType::i32);
    random_batch(ids, targets, 23);
    model.forward(ids, targets);
    EXPECT_GT(mt::nn::saved_bytes(model.saved_for_backward()), 0u);
}
