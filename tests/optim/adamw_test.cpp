// optim::AdamW: the offloaded update (host state, chunked copies) equals the on-device one; bf16 moments with
// stochastic rounding are unbiased, reproducible, and the same on the CPU and the GPU.
#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "core/stochastic_round.h"

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

// Three parameters of awkward sizes (padding between them in the arena), one without weight decay.
void declare(mt::nn::ParamTable& table) {
    table.add({.name = "a", .shape = {7, 13}});
    table.add({.name = "b", .shape = {300}, .weight_decay = false});
    table.add({.name = "c", .shape = {5, 41}});
}

// Deterministic gradients for step s, written into the table's gradient arena (on its device).
void fill_grads(mt::nn::ParamTable& table, int64_t s) {
    for (int i = 0; i < table.size(); ++i) {
        Tensor host = Tensor::zeros(table.grad(i).shape(), DType::f32);
        mt::core::rng_fill_normal(host, 11 + static_cast<uint64_t>(s), static_cast<uint64_t>(i), 0.0, 1.0);
        table.grad(i).copy_from(host);
    }
}

std::vector<float> host_floats(const Tensor& t) {
    const Tensor h = t.to_device(Device::cpu).to(DType::f32);
    return {h.data<float>(), h.data<float>() + h.numel()};
}

struct AdamWRun {
    std::vector<float> master, weights, m;
};

// `steps` AdamW steps on a fresh table of `precision`, with the given options.
AdamWRun run_adamw(mt::nn::Precision precision, const mt::optim::AdamWOptions& options, int steps = 6) {
    mt::nn::ParamTable table;
    declare(table);
    table.finalize(precision);
    table.initialize(3);
    mt::optim::AdamW adamw(table, {.lr = 1e-2, .weight_decay = 0.1}, std::nullopt, options);
    for (int s = 1; s <= steps; ++s) {
        fill_grads(table, s);
        adamw.step(1e-2, s, 0.5);
    }
    mt::core::backend_get(precision.device).synchronize();
    AdamWRun r{host_floats(table.master_arena()), host_floats(table.param_arena()), {}};
    for (const auto& p : adamw.pieces())
        for (float x : host_floats(adamw.m(p))) r.m.push_back(x);
    return r;
}

// Chunks of 100 elements cut every parameter and the padding between them: the pipeline's bookkeeping at every
// kind of boundary. On the CPU the arithmetic is the same kernel's, so the results are bit for bit equal.
TEST(AdamWOffload, ChunkedHostUpdateEqualsInPlaceOnTheCpu) {
    const AdamWRun device = run_adamw(mt::nn::Precision::cpu(DType::f32), {});
    mt::nn::Precision host = mt::nn::Precision::cpu(DType::f32);
    host.master_on_host = true;
    for (int64_t chunk : {int64_t{100}, int64_t{1} << 24}) {
        const AdamWRun off = run_adamw(host, {.offload = true, .offload_chunk = chunk});
        EXPECT_EQ(off.master, device.master) << "chunk " << chunk;
        EXPECT_EQ(off.weights, device.weights) << "chunk " << chunk;
        EXPECT_EQ(off.m, device.m) << "chunk " << chunk;
    }
}

TEST(AdamWOffload, NeedsTheMasterWeightsOnTheHost) {
    mt::nn::ParamTable table;
    declare(table);
    table.finalize(mt::nn::Precision::cpu(DType::f32));
    EXPECT_THROW(mt::optim::AdamW(table, {}, std::nullopt, {.offload = true}), mt::core::Error);
}

// E[stored] = x: the mean over many independent roundings of values between two bf16 neighbours approaches x,
// and each rounding is one of the two neighbours.
TEST(StochasticRounding, IsUnbiasedAndPicksANeighbour) {
    for (float x : {1.0f + 1.0f / 512.0f, -3.14159f, 1e-20f, 12345.678f}) {
        double sum = 0.0;
        const int n = 200000;
        for (int i = 0; i < n; ++i) {
            const float r = mt::core::bf16_to_f32(mt::core::f32_to_bf16_stochastic(x, mt::core::sr_random_bits(5, i)));
            ASSERT_LE(std::fabs(r - x), std::fabs(x) / 128.0f) << x;  // within one bf16 ulp: a neighbour
            sum += r;
        }
        const double ulp = std::fabs(static_cast<double>(x)) / 128.0;
        EXPECT_NEAR(sum / n, x, 0.01 * ulp) << x;
    }
    EXPECT_TRUE(std::isnan(mt::core::bf16_to_f32(mt::core::f32_to_bf16_stochastic(NAN, 0xFFFFu))));
    EXPECT_TRUE(std::isinf(mt::core::bf16_to_f32(mt::core::f32_to_bf16_stochastic(INFINITY, 0xFFFFu))));
}

// A moment's small updates survive bf16 storage on average: 1 + 1e-4 added 1000 times to a bf16 value of 1 stays 1
// under round to nearest (the update is below half an ulp), but grows by about 0.1 with stochastic rounding.
TEST(StochasticRounding, KeepsUpdatesBelowHalfAnUlp) {
    uint16_t stored = mt::core::f32_to_bf16(1.0f);
    for (int i = 0; i < 1000; ++i)
        stored =
            mt::core::f32_to_bf16_stochastic(mt::core::bf16_to_f32(stored) + 1e-4f, mt::core::sr_random_bits(9, i));
    EXPECT_NEAR(mt::core::bf16_to_f32(stored), 1.1f, 0.03f);
}

// bf16 moments: the run is reproducible (the rounding bits depend on the seed, step and element only), close to the
// f32 moments, and the offloaded update stores the same bits.
TEST(AdamWBf16State, ReproducibleCloseToF32AndSameOffloaded) {
    const mt::nn::Precision cpu = mt::nn::Precision::cpu(DType::f32);
    const AdamWRun f32 = run_adamw(cpu, {});
    const AdamWRun a = run_adamw(cpu, {.state_dtype = DType::bf16, .seed = 1});
    const AdamWRun b = run_adamw(cpu, {.state_dtype = DType::bf16, .seed = 1});
    EXPECT_EQ(a.master, b.master);
    EXPECT_EQ(a.m, b.m);
    const AdamWRun other_seed = run_adamw(cpu, {.state_dtype = DType::bf16, .seed = 2});
    EXPECT_NE(a.m, other_seed.m);
    double worst = 0.0;
    for (size_t i = 0; i < a.master.size(); ++i)
        worst = std::max(worst, std::fabs(double(a.master[i]) - f32.master[i]));
    EXPECT_GT(worst, 0.0);
    EXPECT_LT(worst, 1e-3) << "bf16 moments moved the weights far from the f32-state run";
    mt::nn::Precision host = cpu;
    host.master_on_host = true;
    const AdamWRun off =
        run_adamw(host, {.state_dtype = DType::bf16, .offload = true, .seed = 1, .offload_chunk = 100});
    EXPECT_EQ(off.master, a.master);
    EXPECT_EQ(off.m, a.m);
}

// The GPU: f32 state in place vs offloaded (host kernel) within 1e-5 relative; bf16 moments on the GPU within a
// bf16 ulp of the CPU's (the same rounding bits; the f32 values before rounding may differ in the last place).
TEST(GpuAdamW, OffloadAndBf16StateMatchTheCpu) {
    if (!mt::core::backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device";
    const mt::nn::Precision gpu = mt::nn::Precision::cuda_bf16();
    mt::nn::Precision off = gpu;
    off.master_on_host = true;
    const AdamWRun device = run_adamw(gpu, {}, 20);
    const AdamWRun host = run_adamw(off, {.offload = true, .offload_chunk = 100}, 20);
    ASSERT_EQ(device.master.size(), host.master.size());
    for (size_t i = 0; i < device.master.size(); ++i)
        ASSERT_NEAR(host.master[i], device.master[i], 1e-5 * std::fabs(device.master[i]) + 1e-7) << i;
    const AdamWRun gpu_bf16 = run_adamw(gpu, {.state_dtype = DType::bf16, .seed = 1});
    const AdamWRun cpu_bf16 = run_adamw(mt::nn::Precision::cpu(DType::f32), {.state_dtype = DType::bf16, .seed = 1});
    for (size_t i = 0; i < cpu_bf16.m.size(); ++i)
        ASSERT_NEAR(gpu_bf16.m[i], cpu_bf16.m[i], std::fabs(cpu_bf16.m[i]) / 64.0f + 1e-30f) << i;
    for (size_t i = 0; i < cpu_bf16.master.size(); ++i) ASSERT_NEAR(gpu_bf16.master[i], cpu_bf16.master[i], 1e-4) << i;
}

}  // namespace
