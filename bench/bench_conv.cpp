// GPU throughput of the CUDA causal depthwise conv (ops/causal_conv1d.h, SiLU, bf16 x, w and dy, f32 dw as in
// training): one JSON line per case with the forward and backward times (median over the timed iterations, CUDA events
// on the ops' stream) and GB/s over the bytes the op must move: forward x read and y written, backward x and dy read
// and dx written, plus w (and dw read and written) once. The memory roofline is those bytes over the peak bandwidth.
//   bench_conv [--iters 20] [--warmup 3] [--width 4] [--doc-tokens 1000]
// Cases (issue 25): x [4, 4096, 2048] (the 3.2B hybrid's convs) and [8, 4096, 1536] (kimi_linear_mini's q/k/v convs),
// each without a document map and, unless --doc-tokens is 0, with documents every that many tokens.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "ops/causal_conv1d.h"

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

// A [B, T] document-start map with documents every doc_tokens tokens, on the GPU.
Tensor doc_map(int64_t b, int64_t t, int64_t doc_tokens) {
    std::vector<int32_t> host(static_cast<size_t>(b * t));
    for (int64_t i = 0; i < b * t; ++i)
        host[static_cast<size_t>(i)] = static_cast<int32_t>(i % t / doc_tokens * doc_tokens);
    return Tensor::borrow(host.data(), {b, t}, DType::i32).to_device(Device::cuda);
}

void bench_case(int64_t b, int64_t t, int64_t c, int64_t width, int64_t doc_tokens, int warmup, int iters) {
    const Tensor x = mt::bench::random_bf16({b, t, c}, 1), dy = mt::bench::random_bf16({b, t, c}, 2);
    const Tensor w = mt::bench::random_bf16({c, width}, 3, 0.5f);
    const Tensor y = Tensor::zeros(x.shape(), DType::bf16, Device::cuda),
                 dx = Tensor::zeros(x.shape(), DType::bf16, Device::cuda);
    const Tensor dw = Tensor::zeros(w.shape(), DType::f32, Device::cuda);
    const Tensor docs = doc_tokens > 0 ? doc_map(b, t, doc_tokens) : Tensor();
    const double fwd_ms = mt::bench::time_ms([&] { mt::ops::causal_conv1d_fwd(x, w, y, true, docs); }, warmup, iters);
    const double bwd_ms =
        mt::bench::time_ms([&] { mt::ops::causal_conv1d_bwd(x, w, dy, dx, dw, true, docs); }, warmup, iters);
    const double act = static_cast<double>(x.nbytes()), wb = static_cast<double>(w.nbytes());
    const double map = docs.defined() ? static_cast<double>(docs.nbytes()) : 0.0;
    const double fwd_bytes = 2 * act + wb + map, bwd_bytes = 3 * act + wb + 2 * static_cast<double>(dw.nbytes()) + map;
    const nlohmann::json line = {{"bench", "causal_conv1d"},
                                 {"shape", {b, t, c}},
                                 {"width", width},
                                 {"dtype", "bf16"},
                                 {"silu", true},
                                 {"doc_tokens", doc_tokens},
                                 {"fwd_ms", fwd_ms},
                                 {"bwd_ms", bwd_ms},
                                 {"fwd_bytes", fwd_bytes},
                                 {"bwd_bytes", bwd_bytes},
                                 {"fwd_gb_s", fwd_bytes / (fwd_ms * 1e6)},
                                 {"bwd_gb_s", bwd_bytes / (bwd_ms * 1e6)},
                                 {"outputs_finite", mt::bench::all_finite(y) && mt::bench::all_finite(dx)}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain CUDA causal conv benchmark"};
    int iters = 20, warmup = 3;
    int64_t width = 4, doc_tokens = 1000;
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_option("--width", width)->check(CLI::Range(1, 8));
    app.add_option("--doc-tokens", doc_tokens, "document length of the document-map cases, 0 = skip them")
        ->check(CLI::NonNegativeNumber);
    CLI11_PARSE(app, argc, argv);
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "causal_conv1d"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    const std::vector<std::vector<int64_t>> shapes = {{4, 4096, 2048}, {8, 4096, 1536}};
    for (const auto& s : shapes) {
        bench_case(s[0], s[1], s[2], width, 0, warmup, iters);
        if (doc_tokens > 0) bench_case(s[0], s[1], s[2], width, doc_tokens, warmup, iters);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_conv: error: %s\n", e.what());
        return 1;
    }
}
