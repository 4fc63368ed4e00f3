// GPU cost of sliding-window attention with global tokens (long_context.md §2 and §10 test 2): for each sequence
// length, one JSON line with the forward + backward time of a window layer's attention (attention_fwd/bwd with
// AttentionMask::window, then attention_global_fwd/bwd with g global tokens and the sink) and of the full causal
// kernel on the same shape.
//   bench_attn_window [--t-list 8192,16384,...] [--w 4096] [--g 4] [--h 16] [--hkv 16] [--d 128] [--tokens 131072]
//                     [--iters 10] [--warmup 2] [--nondeterministic]
// Each length runs B = tokens / T rows, so every line processes the same tokens and a linear-cost mixer shows a
// flat ns_per_token. FLOPs count the keys each query visits (the masked FLOPs, not the tiles): the window layer
// 4 B H D sum_t (min(t + 1, w) + g) forward (QK^T and PV) and 2.5x that backward, as bench_attention counts; the
// causal kernel the same with t + 1 keys. `window_vs_causal_tflops` is the window kernel's rate over the causal one's:
// how much of the tensor-core rate the band's edge tiles and the merge cost.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/exec.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "ops/attention.h"
#include "ops/attention_global.h"

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

using mt::bench::random_bf16;

struct Timing {
    double fwd_ms, bwd_ms;
    std::string impl;
};

// One layer's attention forward and backward; g > 0 adds the global tokens and the sink.
Timing time_attention(
    int64_t b, int64_t t, int64_t h, int64_t hkv, int64_t d, int64_t w, int64_t g, int warmup, int iters) {
    const Tensor q = random_bf16({b, t, h, d}, 1), k = random_bf16({b, t, hkv, d}, 2),
                 v = random_bf16({b, t, hkv, d}, 3);
    const Tensor dout = random_bf16({b, t, h, d}, 4);
    const Tensor kg = g > 0 ? random_bf16({g, hkv, d}, 5) : Tensor(),
                 vg = g > 0 ? random_bf16({g, hkv, d}, 6) : Tensor();
    const Tensor sink = g > 0 ? Tensor::zeros({h}, DType::f32, Device::cuda) : Tensor();
    const Tensor dsink = g > 0 ? Tensor::zeros({h}, DType::f32, Device::cuda) : Tensor();
    const Tensor out = Tensor::zeros(q.shape(), DType::bf16, Device::cuda),
                 lse = Tensor::zeros({b, h, t}, DType::f32, Device::cuda);
    const Tensor dq = Tensor::zeros(q.shape(), DType::bf16, Device::cuda),
                 dk = Tensor::zeros(k.shape(), DType::bf16, Device::cuda),
                 dv = Tensor::zeros(k.shape(), DType::bf16, Device::cuda);
    const Tensor dkg = g > 0 ? Tensor::zeros(kg.shape(), DType::bf16, Device::cuda) : Tensor(),
                 dvg = g > 0 ? Tensor::zeros(kg.shape(), DType::bf16, Device::cuda) : Tensor();
    const mt::ops::AttentionMask mask{.window = w};
    std::string fwd_impl, bwd_impl;
    mt::ops::AttentionOptions options;
    options.chosen = &fwd_impl;
    const double fwd_ms = mt::bench::time_ms(
        [&] {
            mt::ops::attention_fwd(q, k, v, out, lse, options, mask);
            if (g > 0) mt::ops::attention_global_fwd(q, kg, vg, sink, out, lse);
        },
        warmup,
        iters);
    options.chosen = &bwd_impl;
    const double bwd_ms = mt::bench::time_ms(
        [&] {
            mt::ops::attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, options, mask);
            if (g > 0) mt::ops::attention_global_bwd(q, kg, vg, sink, out, lse, dout, dq, dkg, dvg, dsink);
        },
        warmup,
        iters);
    return {fwd_ms, bwd_ms, "fwd=" + fwd_impl + " bwd=" + bwd_impl};
}

// Keys visited over a row of t queries: sum_i (min(i + 1, w) + g), w = 0 meaning no window.
double keys_visited(int64_t t, int64_t w, int64_t g) {
    double keys = 0;
    for (int64_t i = 0; i < t; ++i) keys += static_cast<double>((w > 0 && i + 1 > w ? w : i + 1) + g);
    return keys;
}

std::vector<int64_t> parse_list(const std::string& text) {
    std::vector<int64_t> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
    return out;
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain sliding-window attention benchmark"};
    std::string t_list = "8192,16384,32768,65536,131072";
    int64_t w = 4096, g = 4, h = 16, hkv = 16, d = 128, tokens = 131072;
    int iters = 10, warmup = 2;
    bool nondeterministic = false;
    app.add_option("--t-list", t_list, "sequence lengths, comma-separated");
    app.add_option("--w", w, "window");
    app.add_option("--g", g, "global tokens (0: none, and no sink)");
    app.add_option("--h", h);
    app.add_option("--hkv", hkv);
    app.add_option("--d", d);
    app.add_option("--tokens", tokens, "tokens per case (B = tokens / T)");
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_flag("--nondeterministic", nondeterministic, "the 5-matmul attention backward (run.deterministic = false)");
    CLI11_PARSE(app, argc, argv);
    mt::core::set_default_exec({mt::core::Lane::main, !nondeterministic});
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "attn_window"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    for (int64_t t : parse_list(t_list)) {
        const int64_t b = tokens / t > 0 ? tokens / t : 1;
        const Timing win = time_attention(b, t, h, hkv, d, w, g, warmup, iters);
        const Timing full = time_attention(b, t, h, hkv, d, 0, 0, warmup, iters);
        const double per_key = 4.0 * static_cast<double>(b * h * d);
        const double win_flop = 3.5 * per_key * keys_visited(t, w, g),
                     full_flop = 3.5 * per_key * keys_visited(t, 0, 0);
        const double win_ms = win.fwd_ms + win.bwd_ms, full_ms = full.fwd_ms + full.bwd_ms;
        const double win_tflops = win_flop / win_ms / 1e9, full_tflops = full_flop / full_ms / 1e9;
        const nlohmann::json line = {{"bench", "attn_window"},
                                     {"impl", "moetrain " + win.impl},
                                     {"deterministic", mt::core::exec().deterministic},
                                     {"B", b},
                                     {"T", t},
                                     {"w", w},
                                     {"g", g},
                                     {"Hq", h},
                                     {"Hkv", hkv},
                                     {"D", d},
                                     {"window_fwd_ms", win.fwd_ms},
                                     {"window_bwd_ms", win.bwd_ms},
                                     {"window_ns_per_token", win_ms * 1e6 / static_cast<double>(b * t)},
                                     {"window_tflops", win_tflops},
                                     {"causal_fwd_bwd_ms", full_ms},
                                     {"causal_ns_per_token", full_ms * 1e6 / static_cast<double>(b * t)},
                                     {"causal_tflops", full_tflops},
                                     {"window_vs_causal_tflops", win_tflops / full_tflops},
                                     {"peak_bytes", mt::core::backend_get(Device::cuda).peak_bytes()},
                                     {"iters", iters}};
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attn_window: error: %s\n", e.what());
        return 1;
    }
}
