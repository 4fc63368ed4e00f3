// The vision tower on the GPU against the CPU reference (label gpu; skipped without a GPU): the spec's tiny ViT (d_v
// 64, 2 blocks, 4 heads) and projector on packed images of several grids, with each vision.pos (2-D RoPE; the learned
// table resized up, down and 1:1), in f32 and bf16 mixed precision: the slot embeddings and every parameter gradient
// within rho of the CPU in f32 on the same (rounded) weights and inputs. The budgets are the whole tower's (two blocks
// and the projector compound each op's error): 1e-4 in f32, 5e-2 in bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/vision/vision_encoder.h"
#include "ops/op_harness.h"

namespace mt::nn {
namespace {

using core::Device;
using core::DType;

constexpr int64_t kDModel = 48;

VisionConfig gpu_vision(const std::string& pos) {
    VisionConfig cfg;
    cfg.layers = 2;
    cfg.dim = 64;
    cfg.heads = 4;
    cfg.mlp = 256;
    cfg.pos = pos;
    cfg.pos_grid = 8;
    cfg.init_std = 0.05;
    return cfg;
}

double l2(const Tensor& t) {
    const Tensor h = t.to_device(Device::cpu).to(DType::f64);
    double sq = 0.0;
    for (int64_t i = 0; i < h.numel(); ++i) sq += h.data<double>()[i] * h.data<double>()[i];
    return std::sqrt(sq);
}

struct Side {
    ParamTable table;
    VisionEncoder enc;
    Precision precision;
    Side(const VisionConfig& cfg, const Precision& p) : enc(table, cfg, kDModel), precision(p) {
        table.finalize(p);
        table.initialize(3);
    }
};

void compare_towers(const std::string& pos, const Precision& p, double budget) {
    const VisionConfig cfg = gpu_vision(pos);
    Side cpu(cfg, Precision::cpu(DType::f32)), gpu(cfg, p);
    for (int i = 0; i < cpu.table.size(); ++i) gpu.table.master(i).copy_from(cpu.table.master(i));
    gpu.table.refresh_params_from_master();
    for (int i = 0; i < cpu.table.size(); ++i)  // the CPU on the GPU's (rounded) weights
        cpu.table.master(i).copy_from(gpu.table.param(i).to_device(Device::cpu).to(DType::f32));
    VisionBatch batch;
    batch.grids = {{8, 8}, {4, 6}, {12, 10}, {2, 2}, {8, 16}};  // the 8 x 8 table kept, resized down, up, both
    batch.patches = Tensor::zeros({batch.num_patches(), cfg.patch_values()}, DType::f32);
    core::rng_fill_normal(batch.patches, 13, 1, 0.0, 1.0);
    batch.patches = batch.patches.to(p.compute).to(DType::f32);
    Tensor dout = Tensor::zeros({batch.num_tokens(), kDModel}, DType::f32);
    core::rng_fill_normal(dout, 13, 2, 0.0, 1.0);
    dout = dout.to(p.compute).to(DType::f32);
    const std::string tag = pos + " " + std::string(core::dtype_name(p.compute));
    cpu.table.zero_grads();
    gpu.table.zero_grads();
    const Tensor out_cpu = cpu.enc.forward(batch).clone();
    cpu.enc.backward(dout);
    const Tensor out_gpu = gpu.enc.forward(batch).to_device(Device::cpu).to(DType::f32);
    gpu.enc.backward(dout.to(p.compute).to_device(Device::cuda));
    auto expect_close = [&](const std::string& what, const Tensor& got, const Tensor& ref) {
        const double rho = ops::test::op_parity_rho(got, ref);
        std::printf("[ VISION GPU ] %s %s: rho %.3e (budget %.0e)\n", tag.c_str(), what.c_str(), rho, budget);
        EXPECT_LE(rho, budget) << tag << " " << what;
    };
    expect_close("out", out_gpu, out_cpu);
    for (int i = 0; i < cpu.table.size(); ++i) {
        const std::string& name = cpu.table.spec(i).name;
        if (!cfg.rope2d() && name.ends_with(".attn.k.bias")) {
            // Unrotated, the key bias's gradient is 0 in exact arithmetic (the softmax cancels q.b in every row): both
            // sides hold rounding noise, which must stay small against the key weight's gradient.
            const double scale = l2(cpu.table.grad(cpu.table.find(name.substr(0, name.size() - 4) + "weight")));
            EXPECT_LE(l2(gpu.table.grad(i)), budget * scale) << tag << " d" << name;
            continue;
        }
        expect_close("d" + name, gpu.table.grad(i), cpu.table.grad(i));
    }
}

bool skip() {
    return !ops::test::op_gpu_available();
}

TEST(GpuVisionEncoder, Rope2dF32MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_towers("rope2d", Precision::cuda_f32(), 1e-4);
}

TEST(GpuVisionEncoder, LearnedF32MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_towers("learned", Precision::cuda_f32(), 1e-4);
}

TEST(GpuVisionEncoder, Rope2dBf16MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_towers("rope2d", Precision::cuda_bf16(), 5e-2);
}

TEST(GpuVisionEncoder, LearnedBf16MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_towers("learned", Precision::cuda_bf16(), 5e-2);
}

}  // namespace
}  // namespace mt::nn
