// kda.save = "tiles" | "states" | "workspace" on the GPU, where the KDA op keeps what they name from a training
// forward to its backward (ops::KdaSaved): through the whole layer in bf16 at the model's head shape (K = V = 128,
// the tensor-core kernels' compile-time shape), every gradient (dx, dS_0, each parameter's) must equal the
// recomputing layer's (kda.save = "none") bit for bit; a training forward keeps the tensors, an evaluation forward
// keeps none, and the backward frees them (a second backward from the same forward recomputes and returns the same
// bits). "states_bf16" keeps the states in bf16, which rounds them: its gradients must stay within
// the bf16 budget of the recomputing layer's, differ from them (the kept states were read), and its second backward
// recomputes and returns the recomputing layer's bits. Skipped without a GPU (label gpu). The CPU keeps nothing,
// which is why this test needs the GPU to check anything.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/layers/kda_layer.h"
#include "ops/op_harness.h"

namespace mt::nn {
namespace {

using core::Device;
using core::DType;
using core::Shape;
using core::Tensor;

constexpr int64_t kBatch = 2, kSeq = 150;  // two full chunks of 64 and a tail of 22

ModelConfig model_shape() {
    ModelConfig c;
    c.d_model = 256;
    c.n_layers = 2;
    c.n_heads = 2;
    c.init_std = 0.1;
    c.kda.num_heads = 2;
    c.kda.num_v_heads = 2;
    c.kda.head_dim = 128;
    c.kda.head_v_dim = 128;
    c.kda.chunk_size = 64;
    return c;
}

// One bf16 layer on the GPU with the same weights, inputs and loss weights for every kda.save.
struct GpuLayer {
    ParamTable table;
    KdaLayer layer;
    Workspace ws;
    Tensor x, dout, out, s0, dst;

    static ModelConfig with_save(ModelConfig c, KdaSave save) {
        c.kda.save = save;
        return c;
    }

    explicit GpuLayer(KdaSave save) : layer(table, "layers.0.kda", with_save(model_shape(), save)) {
        const Precision p = Precision::cuda_bf16();
        table.finalize(p);
        table.initialize(17);
        layer.resize(kBatch, kSeq, p);
        const int64_t d = model_shape().d_model, hv = layer.num_v_heads(), k = layer.head_dim(), v = layer.head_v_dim();
        auto device = [](const Shape& shape, uint64_t stream, double std, DType dt) {
            Tensor t = Tensor::zeros(shape, DType::f32);
            core::rng_fill_normal(t, 23, stream, 0.0, std);
            return t.to(dt).to_device(Device::cuda);
        };
        x = device({kBatch * kSeq, d}, 1, 1.0, DType::bf16);
        dout = device({kBatch * kSeq, d}, 2, 1.0, DType::bf16);
        s0 = device({kBatch, hv, k, v}, 3, 0.5, DType::f32);  // the state stays f32 in mixed precision
        dst = device({kBatch, hv, k, v}, 4, 1.0, DType::f32);
        out = Tensor::zeros(x.shape(), DType::bf16, Device::cuda);
        layer.set_initial_state(s0);
        layer.set_final_state_grad(dst);
    }

    // The bytes the layer keeps for its KDA op now (the kept.* entries of saved_for_backward).
    int64_t kept_bytes() {
        int64_t bytes = 0;
        for (const SavedTensor& s : layer.saved_for_backward())
            if (s.name.starts_with("kept.") && s.tensor->defined()) bytes += s.tensor->nbytes();
        return bytes;
    }

    // Backward into fresh gradients: dx, dS_0 and every parameter gradient, on the host as raw bytes.
    std::vector<std::pair<std::string, Tensor>> backward() {
        table.zero_grads();
        const Tensor dx = Tensor::zeros(x.shape(), DType::bf16, Device::cuda);
        layer.backward(x, dout, dx, ws);
        std::vector<std::pair<std::string, Tensor>> r = {{"dx", dx.to_device(Device::cpu)},
                                                         {"ds0", layer.initial_state_grad().to_device(Device::cpu)}};
        for (int i = 0; i < table.size(); ++i)
            r.push_back({"d" + table.spec(i).name, table.grad(i).to_device(Device::cpu)});
        return r;
    }
};

void expect_identical(const std::vector<std::pair<std::string, Tensor>>& a,
                      const std::vector<std::pair<std::string, Tensor>>& b,
                      const std::string& what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        const Tensor &x = a[i].second, &y = b[i].second;
        ASSERT_TRUE(x.defined() && y.defined()) << what << ": " << a[i].first;
        EXPECT_TRUE(ops::test::op_same_bytes(x, y))
            << what << ": " << a[i].first << " differs from the default layer's";
    }
}

bool all_finite(const Tensor& host) {
    for (int64_t e = 0; e < host.numel(); ++e)
        if (!std::isfinite(core::tensor_get_flat(host, e))) return false;
    return true;
}

TEST(GpuKdaLayerSaved, SaveOptionsKeepTheGradientsBitForBit) {
    if (!ops::test::op_gpu_available()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    GpuLayer plain(KdaSave::none);
    plain.layer.forward(plain.x, plain.out);
    EXPECT_EQ(plain.kept_bytes(), 0) << "the default layer keeps nothing";
    const auto base = plain.backward();
    for (const auto& [name, t] : base) EXPECT_TRUE(all_finite(t)) << name;
    double dx_abs = 0;
    for (int64_t e = 0; e < base[0].second.numel(); ++e) dx_abs += std::fabs(core::tensor_get_flat(base[0].second, e));
    EXPECT_GT(dx_abs, 0.0) << "dx is zero: the comparison would be empty";
    for (KdaSave keep : {KdaSave::tiles, KdaSave::states, KdaSave::workspace}) {
        const std::string what = std::string("kda.save = ") + enum_name(keep);
        GpuLayer kept(keep);
        // An evaluation forward keeps nothing, whatever the config.
        kept.layer.forward(kept.x, kept.out, /*training=*/false);
        EXPECT_EQ(kept.kept_bytes(), 0) << what << ": an evaluation forward kept tensors";
        kept.layer.forward(kept.x, kept.out);
        const int64_t bytes = kept.kept_bytes();
        std::printf("[ KDA LAYER ] %s: %lld bytes kept by the training forward\n", what.c_str(), (long long)bytes);
        EXPECT_GT(bytes, 0) << what << ": the training forward kept nothing";
        expect_identical(base, kept.backward(), what);
        EXPECT_EQ(kept.kept_bytes(), 0) << what << ": the backward did not free the kept tensors";
        // A second backward from the same forward recomputes what was freed and returns the same bits.
        expect_identical(base, kept.backward(), what + ", second backward");
    }
}

TEST(GpuKdaLayerSaved, Bf16StatesStayWithinTheBudgetAndAreRead) {
    if (!ops::test::op_gpu_available()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    GpuLayer plain(KdaSave::none);
    plain.layer.forward(plain.x, plain.out);
    const auto base = plain.backward();
    GpuLayer kept(KdaSave::states_bf16);
    kept.layer.forward(kept.x, kept.out, /*training=*/false);
    EXPECT_EQ(kept.kept_bytes(), 0) << "an evaluation forward kept tensors";
    kept.layer.forward(kept.x, kept.out);
    // hs [K, V] and Vn [C, V] per chunk in bf16: (128 * 128 + 64 * 128) * 2 bytes per chunk of 64 tokens, 768 bytes
    // per token and value head, over B * HV * nc = 2 * 2 * 3 chunks.
    EXPECT_EQ(kept.kept_bytes(), int64_t{2} * 2 * 3 * (128 * 128 + 64 * 128) * 2);
    const auto got = kept.backward();
    EXPECT_EQ(kept.kept_bytes(), 0) << "the backward did not free the kept tensors";
    ASSERT_EQ(got.size(), base.size());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double rho = ops::test::op_parity_rho(got[i].second, base[i].second);
        std::printf(
            "[ KDA LAYER ] kda.save = states_bf16: %s rho %.3g against kda.save = none\n", got[i].first.c_str(), rho);
        EXPECT_LE(rho, 1e-2) << got[i].first;
        differ += !ops::test::op_same_bytes(got[i].second, base[i].second);
    }
    EXPECT_GT(differ, 0) << "every gradient equals the recomputing layer's: the bf16 states were not read";
    expect_identical(base, kept.backward(), "kda.save = states_bf16, second backward (recomputes)");
}

}  // namespace
}  // namespace mt::nn
