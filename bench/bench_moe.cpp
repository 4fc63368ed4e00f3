// GPU throughput of the MoE layer (nn/layers/moe_layer.h) in bf16 mixed precision: forward and forward + backward, each
// including the router GEMM, routing (scores, top-k, QB cutoff and histogram), the device plan, permutation, the
// grouped expert GEMMs, SwiGLU and the combine. One JSON line per case (median over the timed iterations, CUDA
// events on the ops' stream).
//   bench_moe [--iters 10] [--warmup 3] [--tokens 16384] [--d 2048] [--ffn 1024] [--ffn-1024 256] [--top-k 8]
//             [--grouped-gemm all|both|auto|device|cublaslt] [--experts 64,256,1024]
// Cases (issue 5, issue 25): 64 experts (target fwd + bwd <= 12 ms), 256 experts, and 1024 experts of width
// --ffn-1024, no shared expert; each with every expert-GEMM implementation asked for (moe.grouped_gemm; "all", the
// default: auto, then the device grouped GEMM, then cuBLASLt per expert, where the device kernel runs; "both": the
// last two). FLOPs: forward = 3 expert GEMMs x
// 2 T k d F + the router 2 T d E; forward + backward = 3 x the forward.
// A second line per case ("bench": "moe_gemm") times the expert GEMMs alone on balanced offsets (device offsets for
// the device kernel, host offsets for cuBLASLt): the three forward GEMMs, the three backward calls (dx and dw, dw
// into f32; bwd_dw_written_ms: the dw products as a step's first gradient, written instead of added to), and the
// host's time to enqueue the forward ones: where device and host times are close, the launches,
// not the GPU, bound the layer.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "nn/layers/moe_layer.h"
#include "ops/grouped_linear.h"

namespace {

using mt::bench::all_finite;
using mt::bench::time_ms;
using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

using mt::ops::GroupedGemm;

GroupedGemm parse_gemm(const std::string& text) {
    for (const auto& [value, name] : mt::nn::EnumNames<GroupedGemm>::names)
        if (text == name) return value;
    return GroupedGemm::automatic;
}

const char* impl_text(GroupedGemm g) {
    switch (g) {
        case GroupedGemm::device:
            return "moetrain-cuda (device grouped GEMM, one launch per product, device plan)";
        case GroupedGemm::cublaslt:
            return "moetrain-cuda (cuBLASLt per expert on 4 streams, device plan)";
        default:
            return "moetrain-cuda (moe.grouped_gemm auto: the device forward to 1,024 rows an expert, the device dx to "
                   "512, dw on cuBLASLt)";
    }
}

void bench_case(
    int64_t t, int64_t d, int64_t f, int64_t e, int64_t k, GroupedGemm gemm, double target_ms, int warmup, int iters) {
    mt::nn::ModelConfig model;
    model.d_model = d;
    model.n_layers = 24;
    model.init_std = 0.02;
    mt::nn::MoeConfig moe;
    moe.num_experts = e;
    moe.top_k = k;
    moe.num_shared_experts = 0;
    moe.expert_ffn_dim = f;
    moe.grouped_gemm = gemm;
    const mt::nn::Precision precision = mt::nn::Precision::cuda_mixed(DType::bf16);
    mt::nn::ParamTable table;
    mt::nn::MoeLayer layer(table, "layers.1.moe", model, moe);
    table.finalize(precision);
    table.initialize(1);
    layer.resize(t, precision);
    Tensor xh = Tensor::zeros({t, d}, DType::f32), dh = Tensor::zeros({t, d}, DType::f32);
    mt::core::rng_fill_normal(xh, 3, 1, 0.0, 1.0);
    mt::core::rng_fill_normal(dh, 3, 2, 0.0, 1e-2);
    const Tensor x = xh.to(DType::bf16).to_device(Device::cuda), dout = dh.to(DType::bf16).to_device(Device::cuda);
    const Tensor out = Tensor::zeros({t, d}, DType::bf16, Device::cuda), dx = out.clone();
    mt::nn::Workspace ws;
    auto fwd = [&] { layer.forward(x, out, true); };
    const double fwd_ms = time_ms(fwd, warmup, iters);
    const double fwd_bwd_ms = time_ms(
        [&] {
            table.zero_grads(/*skip_written_whole=*/true);  // as a training step: the experts' dw are written
            fwd();
            layer.backward(x, dout, dx, ws);
        },
        warmup,
        iters);
    const mt::nn::MoeStepMetrics m = layer.step_end(1);
    const bool finite = all_finite(out) && all_finite(dx);
    const double gemm_flops = 3.0 * 2.0 * static_cast<double>(t * k) * static_cast<double>(d * f);
    const double fwd_flops = gemm_flops + 2.0 * static_cast<double>(t) * static_cast<double>(d * e);
    const nlohmann::json line = {{"bench", "moe"},
                                 {"impl", impl_text(gemm)},
                                 {"grouped_gemm", mt::nn::enum_name(gemm)},
                                 {"dtype", "bf16 (f32 routing and grads)"},
                                 {"balance", "quantile"},
                                 {"T", t},
                                 {"d", d},
                                 {"F", f},
                                 {"E", e},
                                 {"k", k},
                                 {"fwd_ms", fwd_ms},
                                 {"fwd_bwd_ms", fwd_bwd_ms},
                                 {"fwd_tflops", fwd_flops / fwd_ms * 1e-9},
                                 {"fwd_bwd_tflops", 3.0 * fwd_flops / fwd_bwd_ms * 1e-9},
                                 {"target_fwd_bwd_ms", target_ms},
                                 {"meets_target", target_ms <= 0 || fwd_bwd_ms <= target_ms},
                                 {"max_vio", m.max_vio},
                                 {"outputs_finite", finite},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

// The expert GEMMs alone, rows split evenly over the experts: the forward's three, then the backward's three calls,
// then their three dw products alone (bwd_dx_ms is the difference).
void bench_gemms(int64_t t, int64_t d, int64_t f, int64_t e, int64_t k, GroupedGemm gemm, int warmup, int iters) {
    const int64_t rows = t * k;
    Tensor offsets = Tensor::zeros({e + 1}, DType::i32);
    for (int64_t j = 0; j <= e; ++j) offsets.data<int32_t>()[j] = static_cast<int32_t>(rows * j / e);
    if (gemm != GroupedGemm::cublaslt) offsets = offsets.to_device(Device::cuda);
    auto dev = [](const mt::core::Shape& s, DType dt = DType::bf16) { return Tensor::zeros(s, dt, Device::cuda); };
    const Tensor xp = dev({rows, d}), wg = dev({e, f, d}), wd = dev({e, d, f}), h = dev({rows, f}), y = dev({rows, d});
    const Tensor dwg = dev({e, f, d}, DType::f32), dwd = dev({e, d, f}, DType::f32), dxp = dev({rows, d});
    const Tensor dh = dev({rows, f});
    auto gemms = [&] {
        mt::ops::grouped_linear_fwd(xp, wg, offsets, h, gemm);
        mt::ops::grouped_linear_fwd(xp, wg, offsets, h, gemm);
        mt::ops::grouped_linear_fwd(h, wd, offsets, y, gemm);
    };
    auto backward = [&] {
        mt::ops::grouped_linear_bwd(h, wd, offsets, y, dh, dwd, false, gemm);
        mt::ops::grouped_linear_bwd(xp, wg, offsets, h, dxp, dwg, false, gemm);
        mt::ops::grouped_linear_bwd(xp, wg, offsets, h, dxp, dwg, true, gemm);
    };
    auto dw_only = [&] {  // the backward's three dw products alone (dx undefined: skipped)
        mt::ops::grouped_linear_bwd(h, wd, offsets, y, Tensor(), dwd, false, gemm);
        mt::ops::grouped_linear_bwd(xp, wg, offsets, h, Tensor(), dwg, false, gemm);
        mt::ops::grouped_linear_bwd(xp, wg, offsets, h, Tensor(), dwg, false, gemm);
    };
    const double ms = time_ms(gemms, warmup, iters), bwd_ms = time_ms(backward, warmup, iters);
    const double dw_ms = time_ms(dw_only, warmup, iters);
    auto dw_written = [&] {  // the same, as the step's first gradient: written (=), no read of dw
        using mt::ops::grouped_linear_bwd;
        grouped_linear_bwd(h, wd, offsets, y, Tensor(), dwd, false, gemm, /*accumulate_dw=*/false);
        grouped_linear_bwd(xp, wg, offsets, h, Tensor(), dwg, false, gemm, /*accumulate_dw=*/false);
        grouped_linear_bwd(xp, wg, offsets, h, Tensor(), dwg, false, gemm, /*accumulate_dw=*/false);
    };
    const double dw_written_ms = time_ms(dw_written, warmup, iters);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) gemms();
    const double host_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    mt::core::backend_get(Device::cuda).synchronize();
    const double flops = 3.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(d * f);
    const nlohmann::json line = {{"bench", "moe_gemm"},
                                 {"grouped_gemm", mt::nn::enum_name(gemm)},
                                 {"E", e},
                                 {"F", f},
                                 {"rows", rows},
                                 {"fwd_gemms_ms", ms},
                                 {"bwd_gemms_ms", bwd_ms},
                                 {"bwd_dw_ms", dw_ms},
                                 {"bwd_dw_written_ms", dw_written_ms},
                                 {"bwd_dx_ms", bwd_ms - dw_ms},
                                 {"host_enqueue_ms", host_ms},
                                 {"tflops", flops / ms * 1e-9},
                                 {"bwd_tflops", 2.0 * flops / bwd_ms * 1e-9},
                                 {"gemm_launches", gemm == GroupedGemm::cublaslt ? 3 * e : 3}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain MoE layer benchmark"};
    int64_t t = 16384, d = 2048, f = 1024, f1024 = 256, k = 8;
    int iters = 10, warmup = 3;
    std::string which = "all";
    std::vector<int64_t> experts = {64, 256, 1024};
    app.add_option("--tokens", t);
    app.add_option("--d", d);
    app.add_option("--ffn", f);
    app.add_option("--ffn-1024", f1024, "expert width of the 1024-expert case");
    app.add_option("--top-k", k);
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_option("--grouped-gemm",
                   which,
                   "moe.grouped_gemm to time, both (device, then cublaslt) or all (auto, the default setting, first)")
        ->check(CLI::IsMember({"all", "both", "auto", "device", "cublaslt"}));
    app.add_option("--experts", experts, "expert counts (64, 256 and 1024 by default)")->delimiter(',');
    CLI11_PARSE(app, argc, argv);
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "moe"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    std::vector<GroupedGemm> gemms = {GroupedGemm::device, GroupedGemm::cublaslt};
    if (which == "all") gemms.insert(gemms.begin(), GroupedGemm::automatic);
    if (which != "all" && which != "both") gemms = {parse_gemm(which)};
    const bool every = which == "all" || which == "both";
    for (const int64_t e : experts) {
        const int64_t width = e == 1024 ? f1024 : f;
        const bool device = mt::ops::grouped_linear_device_why_not(DType::bf16, DType::f32, d, width).empty();
        for (const GroupedGemm g : gemms) {
            if (every && g == GroupedGemm::device && !device) continue;  // "all", "both": where it runs
            bench_case(t, d, width, e, k, g, e == 64 ? 12.0 : 0.0, warmup, iters);
            // The GEMMs alone per implementation (auto is the layer's split of the two: its layer line says it).
            if (g != GroupedGemm::automatic) bench_gemms(t, d, width, e, k, g, warmup, iters);
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_moe: %s\n", e.what());
        return 1;
    }
}
