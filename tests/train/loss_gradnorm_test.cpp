// GradNorm's measurement (train/loss_gradnorm.h; multimodal.md §5 and §9 item 5): on a tiny f64 MoE model, each
// source's G_i = ||grad_W (w_i C_i / N)||_2 equals the norm of the fp64 central finite differences of w_i C_i / N over
// every element of W (the default W: the last layer's shared-expert down projection); the default's fallbacks and a bad
// loss.gradnorm_layer (exit 2).
#include "train/loss_gradnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace mt::train {
namespace {

nn::ModelConfig tiny_moe() {
    nn::ModelConfig c;
    c.vocab_size = 23;
    c.d_model = 12;
    c.n_layers = 2;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.d_ff = 20;
    c.max_seq_len = 16;
    c.init_std = 0.3;  // large enough that every path carries gradient
    c.moe_enabled = true;
    c.moe_first_k_dense = 1;
    c.moe_dense_ffn_dim = 16;
    c.moe.num_experts = 4;
    c.moe.top_k = 2;
    c.moe.num_shared_experts = 1;
    c.moe.expert_ffn_dim = 6;
    return c;
}

TEST(LossGradNorm, SourceGradientNormsMatchFiniteDifferences) {
    nn::Model model(tiny_moe(), nn::Precision::cpu(core::DType::f64));
    model.params().initialize(11);
    nn::ParamTable& table = model.params();
    const int w_param = gradnorm_param(table, 2, "");
    EXPECT_EQ(table.spec(w_param).name, "layers.1.moe.shared.w_down.weight");
    const int64_t rows = 3, seq = 8;
    const core::Tensor ids = core::Tensor::zeros({rows, seq}, core::DType::i32), targets = ids.clone();
    for (int64_t i = 0; i < rows * seq; ++i) {
        ids.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 2) % 23);
        targets.data<int32_t>()[i] = i % 7 == 3 ? nn::kIgnoreIndex : static_cast<int32_t>((i * 3 + 1) % 23);
    }
    const std::vector<int32_t> sources = {0, 1, 0};
    const std::vector<double> w = {0.7, 1.3};
    model.forward(ids, targets);
    const double n = static_cast<double>(model.last_counted_tokens());
    const std::vector<double> g = gradnorm_grad_norms(
        model,
        w_param,
        1,
        [&](int64_t) { return std::make_pair(ids, targets); },
        {sources},
        w,
        n,
        /*loss_scale=*/4.0,  // divided out
        [](core::Tensor&) {});
    ASSERT_EQ(g.size(), 2u);
    // w_i C_i / N from the plain forward's per-token losses.
    auto source_loss = [&](size_t k) {
        model.forward(ids, targets);
        const core::Tensor& l = model.last_token_losses();
        double c = 0.0;
        for (int64_t i = 0; i < rows * seq; ++i)
            if (static_cast<size_t>(sources[static_cast<size_t>(i / seq)]) == k) c += core::tensor_get_flat(l, i);
        return w[k] * c / n;
    };
    const core::Tensor param = table.param(w_param);
    for (size_t k = 0; k < 2; ++k) {
        double sq = 0.0;
        for (int64_t j = 0; j < param.numel(); ++j) {
            const double x = core::tensor_get_flat(param, j), h = 1e-6 * std::max(1.0, std::abs(x));
            core::tensor_set_flat(param, j, x + h);
            const double up = source_loss(k);
            core::tensor_set_flat(param, j, x - h);
            const double down = source_loss(k);
            core::tensor_set_flat(param, j, x);
            const double d = (up - down) / (2 * h);
            sq += d * d;
        }
        EXPECT_GT(g[k], 0.0);
        EXPECT_NEAR(g[k], std::sqrt(sq), 1e-6 * std::sqrt(sq)) << "source " << k;
    }
    // The gradients are left zero for the step's own backward.
    const core::Tensor grad = table.grad(w_param);
    for (int64_t j = 0; j < grad.numel(); ++j) ASSERT_EQ(core::tensor_get_flat(grad, j), 0.0);
}

TEST(LossGradNorm, DefaultLayerFallsBackAndABadNameIsRefused) {
    nn::ModelConfig dense = tiny_moe();
    dense.moe_enabled = false;
    nn::Model model(dense, nn::Precision::cpu(core::DType::f64));
    EXPECT_EQ(model.params().spec(gradnorm_param(model.params(), 2, "")).name, "layers.1.mlp.w_down.weight");
    EXPECT_EQ(gradnorm_param(model.params(), 2, "layers.0.mlp.w_down.weight"),
              model.params().find("layers.0.mlp.w_down.weight"));
    try {
        gradnorm_param(model.params(), 2, "layers.9.nope");
        ADD_FAILURE() << "a bad name was accepted";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("loss.gradnorm_layer = \"layers.9.nope\""), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace mt::train
