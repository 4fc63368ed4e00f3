// The MoE layer on the GPU (cuda f32 and bf16 mixed precision) against the CPU f32 layer: outputs, dx, every
// parameter gradient, the routing (identical), the aux loss, the balancer's bias after step_end and the step's
// metrics; a deterministic run twice gives the same bits; the device plan equals the CPU plan bitwise. The router
// reads the first E input columns through an identity-like weight and those columns hold a permuted grid of
// bf16-exact values 0.25 apart, so the logits are exact in every precision and the top-k choice has a wide margin
// (adjacent scores >= 0.026 apart): the routing must then be the same on both devices. Per-modality routing
// (moe.modality_bias balanced and learned, multimodal.md §4) the same way, with the learned offsets c_m bf16-exact and
// under half the grid's spacing. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>

#include "core/rng.h"
#include "nn/layers/moe_layer.h"
#include "ops/grouped_linear.h"
#include "ops/moe_permute.h"
#include "ops/op_harness.h"

namespace mt::nn {
namespace {

using core::Device;
using core::DType;
using core::Tensor;

constexpr int64_t kD = 64, kN = 256;

ModelConfig gpu_model(bool vision = false) {
    ModelConfig c;
    c.d_model = kD;
    c.n_layers = 2;
    c.init_std = 0.2;
    if (vision) {  // the MoE layer takes token modalities
        c.vision.layers = 1;
        c.vision.image_token = 3;
    }
    return c;
}

MoeConfig gpu_moe(MoeBalanceMode mode) {
    MoeConfig m;
    m.num_experts = 16;
    m.top_k = 4;
    m.num_shared_experts = 1;
    m.expert_ffn_dim = 48;
    m.balance.mode = mode;
    m.balance.bins = 100;
    m.balance.aux_coeff = 0.1;
    return m;
}

// One layer with its parameters on one device and precision.
struct Side {
    ParamTable table;
    std::unique_ptr<MoeLayer> layer;
    Precision precision;
    Workspace ws;
    Tensor x, dout, out, dx;

    Side(const MoeConfig& moe, const Precision& p, bool vision = false) : precision(p) {
        layer = std::make_unique<MoeLayer>(table, "layers.1.moe", gpu_model(vision), moe);
        table.finalize(p);
        table.initialize(7);
        layer->resize(kN, p);
    }
    void run(bool training = true) {
        out = Tensor::zeros(x.shape(), precision.compute, precision.device);
        dx = Tensor::zeros(x.shape(), precision.compute, precision.device);
        table.zero_grads();
        layer->forward(x, out, training);
        layer->backward(x, dout, dx, ws);
    }
};

// x [N, D]: columns 0..E-1 a per-token permutation of 2 - 0.25 r (r = 0..E-1), the rest N(0, 1); and dout N(0, 1).
std::pair<Tensor, Tensor> inputs(int64_t e) {
    Tensor x = Tensor::zeros({kN, kD}, DType::f32), d = Tensor::zeros({kN, kD}, DType::f32);
    core::rng_fill_normal(x, 11, 1, 0.0, 1.0);
    core::rng_fill_normal(d, 11, 2, 0.0, 1.0);
    std::vector<int64_t> perm(static_cast<size_t>(e));
    for (int64_t i = 0; i < kN; ++i) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = e - 1; j > 0; --j)
            std::swap(perm[static_cast<size_t>(j)],
                      perm[core::rng_u64(11, 3, static_cast<uint64_t>(i * e + j)) % static_cast<uint64_t>(j + 1)]);
        for (int64_t r = 0; r < e; ++r)
            core::tensor_set_flat(x, i * kD + perm[static_cast<size_t>(r)], 2.0 - 0.25 * static_cast<double>(r));
    }
    return {x, d};
}

// The GPU side's weights from the CPU side's (rounded to the GPU's param dtype), the CPU side's then set to exactly
// the rounded values, the router weight identity-like; inputs rounded the same way on both sides.
void sync_sides(Side& cpu, Side& gpu, int64_t e) {
    const int router = cpu.table.find("layers.1.moe.router.weight");
    Tensor w = Tensor::zeros({e, kD}, DType::f32);
    for (int64_t j = 0; j < e; ++j) core::tensor_set_flat(w, j * kD + j, 1.0);
    cpu.table.master(router).copy_from(w);
    // learned per-modality offsets: c[m][j] in {-1/16, 0, 1/16}, so the biased grid keeps adjacent logits >= 1/8 apart
    if (const int c = cpu.table.find("layers.1.moe.router.modality_bias"); c >= 0) {
        Tensor cm = Tensor::zeros(cpu.table.master(c).shape(), DType::f32);
        for (int64_t i = 0; i < cm.numel(); ++i)
            core::tensor_set_flat(cm, i, 0.0625 * static_cast<double>((i % e + i / e) % 3) - 0.0625);
        cpu.table.master(c).copy_from(cm);
    }
    for (int i = 0; i < cpu.table.size(); ++i) {
        gpu.table.master(i).copy_from(cpu.table.master(i));
    }
    gpu.table.refresh_params_from_master();
    for (int i = 0; i < cpu.table.size(); ++i)
        cpu.table.master(i).copy_from(gpu.table.param(i).to_device(Device::cpu).to(DType::f32));
    auto [x, d] = inputs(e);
    const DType dt = gpu.precision.compute;
    gpu.x = x.to(dt).to_device(Device::cuda), gpu.dout = d.to(dt).to_device(Device::cuda);
    cpu.x = x.to(dt).to(DType::f32), cpu.dout = d.to(dt).to(DType::f32);
}

void expect_close(const std::string& what, const Tensor& got, const Tensor& ref, double budget) {
    const double rho = ops::test::op_parity_rho(got, ref);
    std::printf("[ MOE GPU ] %s: rho %.3e (budget %.0e)\n", what.c_str(), rho, budget);
    EXPECT_LE(rho, budget) << what;
}

void compare_layers(
    const MoeConfig& moe, const Precision& p, double budget, const std::string& tag, bool modalities = false) {
    const int64_t e = moe.num_experts;
    Side cpu(moe, Precision::cpu(DType::f32), modalities), gpu(moe, p, modalities);
    sync_sides(cpu, gpu, e);
    if (modalities) {  // every third token an image token
        Tensor m = Tensor::zeros({kN}, DType::i32);
        for (int64_t i = 0; i < kN; ++i) m.data<int32_t>()[i] = i % 3 == 0 ? 1 : 0;
        cpu.layer->set_modality({m, m});
        gpu.layer->set_modality({m.to_device(Device::cuda), m});
    }
    cpu.run();
    gpu.run();
    EXPECT_TRUE(ops::test::op_same_bytes(gpu.layer->indices(), cpu.layer->indices())) << tag << ": routing differs";
    EXPECT_EQ(gpu.layer->rows_kept(), cpu.layer->rows_kept()) << tag;
    expect_close(tag + " out", gpu.out, cpu.out, budget);
    expect_close(tag + " dx", gpu.dx, cpu.dx, budget);
    expect_close(tag + " gates", gpu.layer->gates(), cpu.layer->gates(), budget);
    for (int i = 0; i < cpu.table.size(); ++i)
        expect_close(tag + " d" + cpu.table.spec(i).name, gpu.table.grad(i), cpu.table.grad(i), budget);
    EXPECT_NEAR(gpu.layer->aux_loss(), cpu.layer->aux_loss(), 1e-6 + budget * std::fabs(cpu.layer->aux_loss()));
    const MoeStepMetrics mg = gpu.layer->step_end(1), mc = cpu.layer->step_end(1);
    EXPECT_EQ(mg.load, mc.load) << tag;
    EXPECT_EQ(mg.dropped, mc.dropped) << tag;
    EXPECT_NEAR(mg.token_entropy, mc.token_entropy, 1e-5) << tag;
    ASSERT_EQ(mg.modality.size(), mc.modality.size()) << tag;
    for (size_t m = 0; m < mc.modality.size(); ++m) {
        EXPECT_EQ(mg.modality[m].load, mc.modality[m].load) << tag << ": modality " << m;
        EXPECT_EQ(mg.modality[m].dropped, mc.modality[m].dropped) << tag << ": modality " << m;
    }
    ASSERT_EQ(gpu.layer->num_balancers(), cpu.layer->num_balancers());
    double worst = 0;
    for (int64_t m = 0; m < cpu.layer->num_balancers(); ++m) {
        const std::vector<float>&bg = gpu.layer->balancer(m).bias(), &bc = cpu.layer->balancer(m).bias();
        for (size_t j = 0; j < bc.size(); ++j) worst = std::max(worst, std::fabs(static_cast<double>(bg[j] - bc[j])));
    }
    std::printf("[ MOE GPU ] %s bias after step_end: max |diff| %.3e\n", tag.c_str(), worst);
    EXPECT_LE(worst, 1e-5) << tag << ": the balancer's bias after step_end";
}

bool skip() {
    return !ops::test::op_gpu_available();
}

TEST(GpuMoeLayer, QuantileF32MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_layers(gpu_moe(MoeBalanceMode::quantile), Precision::cuda_f32(), 1e-5, "qb f32");
}

TEST(GpuMoeLayer, QuantileBf16MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    compare_layers(gpu_moe(MoeBalanceMode::quantile), Precision::cuda_mixed(DType::bf16), 1e-2, "qb bf16");
}

// aux loss, unnormalised gates, no shared expert, capacity 1.0 (position policy drops rows of over-full experts)
TEST(GpuMoeLayer, AuxLossCapacityMatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    MoeConfig moe = gpu_moe(MoeBalanceMode::aux_loss);
    moe.normalize_gates = false;
    moe.num_shared_experts = 0;
    moe.capacity_factor = 1.0;
    moe.drop_policy = ops::MoeDropPolicy::position;
    compare_layers(moe, Precision::cuda_f32(), 1e-5, "aux cap f32");
    compare_layers(moe, Precision::cuda_mixed(DType::bf16), 1e-2, "aux cap bf16");
}

TEST(GpuMoeLayer, SignBiasBf16MatchesCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    MoeConfig moe = gpu_moe(MoeBalanceMode::sign_bias);
    moe.balance.sign_rate = 0.01;
    compare_layers(moe, Precision::cuda_mixed(DType::bf16), 1e-2, "sign bf16");
}

// Per-modality routing: one QB state per modality (the router's bias rows, the grouped histograms), and the learned
// offsets c_m (their gradient through the embedding op's deterministic backward), with capacity drops per modality.
TEST(GpuMoeLayer, ModalityBalancedAndLearnedMatchCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    MoeConfig balanced = gpu_moe(MoeBalanceMode::quantile);
    balanced.modality_bias = MoeModalityBias::balanced;
    compare_layers(balanced, Precision::cuda_f32(), 1e-5, "balanced f32", true);
    compare_layers(balanced, Precision::cuda_mixed(DType::bf16), 1e-2, "balanced bf16", true);
    MoeConfig learned = gpu_moe(MoeBalanceMode::quantile);
    learned.modality_bias = MoeModalityBias::learned;
    learned.capacity_factor = 1.0;
    learned.drop_policy = ops::MoeDropPolicy::position;
    compare_layers(learned, Precision::cuda_f32(), 1e-5, "learned cap f32", true);
    compare_layers(learned, Precision::cuda_mixed(DType::bf16), 1e-2, "learned cap bf16", true);
}

// moe.grouped_gemm: the device grouped GEMM (device offsets, no copy back; skipped off Hopper) and cuBLASLt (host
// offsets) each match the CPU layer, dropless and with capacity drops; "device" where the kernel cannot run (f32)
// fails at resize, naming why.
TEST(GpuMoeLayer, GroupedGemmChoicesMatchCpu) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    const bool device = ops::grouped_linear_device_why_not(DType::bf16, DType::f32, kD, 48).empty();
    for (ops::GroupedGemm choice : {ops::GroupedGemm::device, ops::GroupedGemm::cublaslt}) {
        if (choice == ops::GroupedGemm::device && !device) continue;
        const std::string tag = enum_name(choice);
        MoeConfig moe = gpu_moe(MoeBalanceMode::quantile);
        moe.grouped_gemm = choice;
        compare_layers(moe, Precision::cuda_mixed(DType::bf16), 1e-2, tag + " qb bf16");
        moe.capacity_factor = 1.0;
        moe.drop_policy = ops::MoeDropPolicy::position;
        compare_layers(moe, Precision::cuda_mixed(DType::bf16), 1e-2, tag + " cap bf16");
    }
    MoeConfig moe = gpu_moe(MoeBalanceMode::quantile);
    moe.grouped_gemm = ops::GroupedGemm::device;
    ops::test::expect_op_error([&] { Side f32(moe, Precision::cuda_f32()); },
                               "moe.grouped_gemm = \"device\": x is f32, the device kernel takes bf16");
}

// Two steps, run twice from the same state: outputs, dx, gradients and the bias are the same bits.
TEST(GpuMoeLayer, DeterministicRunTwiceBitwise) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    const MoeConfig moe = gpu_moe(MoeBalanceMode::quantile);
    std::vector<std::vector<Tensor>> runs;
    for (int rep = 0; rep < 2; ++rep) {
        Side cpu(moe, Precision::cpu(DType::f32)), gpu(moe, Precision::cuda_mixed(DType::bf16));
        sync_sides(cpu, gpu, moe.num_experts);
        std::vector<Tensor> got;
        for (int step = 0; step < 2; ++step) {
            gpu.run();
            got.push_back(gpu.out.to_device(Device::cpu));
            got.push_back(gpu.dx.to_device(Device::cpu));
            for (int i = 0; i < gpu.table.size(); ++i) got.push_back(gpu.table.grad(i).to_device(Device::cpu));
            gpu.layer->step_end(step);
            const std::vector<float>& b = gpu.layer->balancer().bias();
            Tensor bt = Tensor::zeros({static_cast<int64_t>(b.size())}, DType::f32);
            std::copy(b.begin(), b.end(), bt.data<float>());
            got.push_back(bt);
        }
        runs.push_back(got);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    for (size_t t = 0; t < runs[0].size(); ++t)
        EXPECT_TRUE(ops::test::op_same_bytes(runs[0][t], runs[1][t])) << "tensor " << t;
}

// The device plan equals the CPU plan bitwise: dropless and both capacity policies, 256 experts (many empty).
TEST(GpuMoePlan, EqualsCpuPlanBitwise) {
    if (skip()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    const int64_t n = 3000, k = 8;
    for (int64_t e : {64, 256, 1000}) {
        Tensor idx = Tensor::zeros({n, k}, DType::i32), gates = Tensor::zeros({n, k}, DType::f32);
        for (int64_t s = 0; s < n * k; ++s) {  // skewed routing (expert e/2 and its neighbours hot), repeated gates
            const uint64_t u = core::rng_u64(5, 1, static_cast<uint64_t>(s));
            const int64_t j = (s % k == 0) ? e / 2 : static_cast<int64_t>((u % static_cast<uint64_t>(e / 2)) * 2);
            core::tensor_set_flat(idx, s, static_cast<double>((j + s % k) % e));
            core::tensor_set_flat(gates, s, static_cast<double>(u % 16) / 16.0);
        }
        for (int64_t cap : {int64_t{0}, int64_t{50}}) {
            for (ops::MoeDropPolicy pol : {ops::MoeDropPolicy::probs, ops::MoeDropPolicy::position}) {
                auto plan = [&](Device d, Tensor* off, Tensor* slot, Tensor* tok) {
                    *off = Tensor::zeros({e + 1}, DType::i32, d);
                    *slot = Tensor::zeros({n, k}, DType::i32, d);
                    *tok = Tensor::zeros({n * k}, DType::i32, d);
                    return ops::moe_permute_plan(idx.to_device(d), gates.to_device(d), e, cap, pol, *off, *slot, *tok);
                };
                Tensor o1, s1, t1, o2, s2, t2;
                const int64_t r1 = plan(Device::cpu, &o1, &s1, &t1), r2 = plan(Device::cuda, &o2, &s2, &t2);
                const std::string tag = fmt::format("E {} capacity {} policy {}", e, cap, static_cast<int>(pol));
                EXPECT_EQ(r1, r2) << tag;
                EXPECT_TRUE(ops::test::op_same_bytes(o2, o1)) << tag << ": offsets";
                EXPECT_TRUE(ops::test::op_same_bytes(s2, s1)) << tag << ": slot_row";
                EXPECT_TRUE(ops::test::op_same_bytes(t2, t1)) << tag << ": row_token";
            }
        }
    }
}

}  // namespace
}  // namespace mt::nn
