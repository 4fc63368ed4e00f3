// GPU throughput of the CUDA attention (causal, GQA, bf16) and of the cuBLASLt linear: one JSON line per case.
//   bench_attention [--b 8] [--t 4096] [--h 16] [--d 128] [--iters 20] [--warmup 3] [--no-extra] [--nondeterministic]
//                   [--deterministic-bwd] [--bidirectional [--doc-len 576]]
// --bidirectional: the vision encoder's attention instead (AttentionMask::causal = false), each row packed with
// documents of --doc-len tokens (576: a 336-pixel image in 14-pixel patches; the last one shorter when it does not
// divide T), on the default (flash) kernels, then unless --no-extra on the mma.sync ones, and on the generic kernels
// (AttentionKernel::generic) for comparison; no linear cases. FLOPs: forward 4 B H D sum over documents of n^2 (every
// query sees its whole document; the useful work, the tiles that straddle two documents compute more), backward 2.5x.
// The main case runs on the default kernel and (unless --no-extra) again on the mma.sync kernels
// (AttentionOptions::kernel); then the same FLOPs at D = 64 (2H heads) and GQA (H / 4 key heads), and unless
// --no-extra the cuBLASLt linear cases. The wgmma backward is the 5-matmul one that sums dq with float reductions
// (flash_bwd_wgmma_fast.cu), in a fixed order by default (`bwd=cuda-wgmma-ordered`) and as scheduled with
// --nondeterministic (core::exec().deterministic off, `cuda-wgmma-fast`); --deterministic-bwd runs the two-kernel
// deterministic backward instead (AttentionOptions::fast_bwd = false, `cuda-wgmma`). `impl` names the kernels each
// case ran.
// Each case is timed with CUDA events on the ops' stream after warm-up; the figure is the median over the timed
// iterations. FLOPs: causal attention forward 4 B H T^2 D / 2 (two matmuls, half the square), backward 2.5x the
// forward (the FlashAttention convention; the two-kernel backward recomputes QK^T and dO V^T in its dq pass and
// does 3.5x, the 5-matmul one 2.5x);
// linear forward 2 N K M, backward 4 N K M (dx and dw). Inputs are pseudo-random (never zeros).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/op_common.h"

#ifdef MT_HAVE_CUDA
#include "core/blas_kernels.h"
#include "core/cuda/cuda_check.h"
#endif

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

using mt::bench::all_finite;
using mt::bench::random_bf16;
using mt::bench::time_ms;

// The document map of rows of t tokens packed with documents of doc_len tokens, on the GPU.
Tensor packed_doc_start(int64_t b, int64_t t, int64_t doc_len) {
    const Tensor map = Tensor::zeros({b, t}, DType::i32);
    for (int64_t row = 0; row < b; ++row)
        for (int64_t i = 0; i < t; ++i)
            mt::core::tensor_set_flat(map, row * t + i, static_cast<double>(i - i % doc_len));
    return map.to_device(Device::cuda);
}

// doc_len 0: causal attention; else bidirectional within documents of doc_len tokens.
void bench_attention(int64_t b,
                     int64_t t,
                     int64_t h,
                     int64_t hkv,
                     int64_t d,
                     int warmup,
                     int iters,
                     mt::ops::AttentionOptions options,
                     int64_t doc_len = 0) {
    const Tensor q = random_bf16({b, t, h, d}, 1), k = random_bf16({b, t, hkv, d}, 2),
                 v = random_bf16({b, t, hkv, d}, 3);
    const Tensor dout = random_bf16({b, t, h, d}, 4);
    const Tensor out = Tensor::zeros(q.shape(), DType::bf16, Device::cuda);
    const Tensor lse = Tensor::zeros({b, h, t}, DType::f32, Device::cuda);
    const Tensor dq = Tensor::zeros(q.shape(), DType::bf16, Device::cuda);
    const Tensor dk = Tensor::zeros(k.shape(), DType::bf16, Device::cuda),
                 dv = Tensor::zeros(k.shape(), DType::bf16, Device::cuda);
    const bool bidir = doc_len > 0;
    const mt::ops::AttentionMask mask =
        bidir ? mt::ops::AttentionMask{.doc_start = packed_doc_start(b, t, doc_len), .causal = false}
              : mt::ops::AttentionMask{};
    std::string fwd_impl, bwd_impl;
    options.chosen = &fwd_impl;
    const double fwd_ms = time_ms([&] { mt::ops::attention_fwd(q, k, v, out, lse, options, mask); }, warmup, iters);
    options.chosen = &bwd_impl;
    const double bwd_ms =
        time_ms([&] { mt::ops::attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, options, mask); }, warmup, iters);
    double score_pairs = static_cast<double>(t) * static_cast<double>(t) / 2.0;  // causal: half the square
    if (bidir) {
        score_pairs = 0.0;
        for (int64_t at = 0; at < t; at += doc_len) {
            const double n = static_cast<double>(std::min(doc_len, t - at));
            score_pairs += n * n;
        }
    }
    const double fwd_flop = 4.0 * static_cast<double>(b * h) * score_pairs * static_cast<double>(d);
    const double bwd_flop = 2.5 * fwd_flop;
    const bool finite = all_finite(lse) && all_finite(dq) && all_finite(dk) && all_finite(dv);
    const nlohmann::json line = {{"bench", "attention"},
                                 {"impl", "moetrain-flash fwd=" + fwd_impl + " bwd=" + bwd_impl},
                                 {"deterministic", mt::core::exec().deterministic},
                                 {"dtype", "bf16"},
                                 {"causal", !bidir},
                                 {"doc_len", bidir ? nlohmann::json(doc_len) : nlohmann::json(nullptr)},
                                 {"B", b},
                                 {"T", t},
                                 {"Hq", h},
                                 {"Hkv", hkv},
                                 {"D", d},
                                 {"fwd_ms", fwd_ms},
                                 {"bwd_ms", bwd_ms},
                                 {"fwd_bwd_ms", fwd_ms + bwd_ms},
                                 {"fwd_tflops", fwd_flop / fwd_ms / 1e9},
                                 {"bwd_tflops", bwd_flop / bwd_ms / 1e9},
                                 {"fwd_bwd_tflops", (fwd_flop + bwd_flop) / (fwd_ms + bwd_ms) / 1e9},
                                 {"outputs_finite", finite},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

void bench_linear(int64_t n, int64_t k, int64_t m, int warmup, int iters) {
    const Tensor x = random_bf16({n, k}, 5), w = random_bf16({m, k}, 6, 0.05f), dy = random_bf16({n, m}, 7);
    const Tensor y = Tensor::zeros({n, m}, DType::bf16, Device::cuda),
                 dx = Tensor::zeros({n, k}, DType::bf16, Device::cuda);
    const Tensor dw = Tensor::zeros({m, k}, DType::f32, Device::cuda);
    const double fwd_ms = time_ms([&] { mt::ops::linear_fwd(x, w, Tensor(), y); }, warmup, iters);
    const double bwd_ms = time_ms([&] { mt::ops::linear_bwd(x, w, dy, dx, dw, Tensor()); }, warmup, iters);
    const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(m);
    const nlohmann::json line = {{"bench", "linear"},
                                 {"impl", "cublaslt"},
                                 {"dtype", "bf16 (dw f32)"},
                                 {"N", n},
                                 {"K", k},
                                 {"M", m},
                                 {"fwd_ms", fwd_ms},
                                 {"bwd_ms", bwd_ms},
                                 {"fwd_tflops", flop / fwd_ms / 1e9},
                                 {"bwd_tflops", 2.0 * flop / bwd_ms / 1e9},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain GPU attention and linear benchmark"};
    int64_t b = 8, t = 4096, h = 16, d = 128;
    int iters = 20, warmup = 3;
    int64_t doc_len = 576;
    bool no_extra = false, nondeterministic = false, deterministic_bwd = false, bidirectional = false;
    app.add_option("--b", b);
    app.add_option("--t", t);
    app.add_option("--h", h);
    app.add_option("--d", d);
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_flag("--no-extra", no_extra, "skip the extra cases (D 64, GQA, linear shapes)");
    app.add_flag("--nondeterministic", nondeterministic, "let ops use non-deterministic kernels (float atomics)");
    app.add_flag("--deterministic-bwd",
                 deterministic_bwd,
                 "run the two-kernel deterministic attention backward (AttentionOptions::fast_bwd = false)");
    app.add_flag("--bidirectional",
                 bidirectional,
                 "bidirectional attention within packed documents (the vision encoder), flash against generic");
    app.add_option("--doc-len", doc_len, "with --bidirectional, the tokens of each packed document")
        ->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);
    mt::core::set_default_exec({mt::core::Lane::main, !nondeterministic});
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "attention"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    mt::ops::AttentionOptions options;
    options.fast_bwd = !deterministic_bwd;
    if (bidirectional) {
        bench_attention(b, t, h, h, d, warmup, iters, options, doc_len);
        mt::ops::AttentionOptions other = options;
        if (!no_extra) {
            other.kernel = mt::ops::AttentionKernel::mma;
            bench_attention(b, t, h, h, d, warmup, iters, other, doc_len);
        }
        other.kernel = mt::ops::AttentionKernel::generic;
        bench_attention(b, t, h, h, d, warmup, iters, other, doc_len);
        return 0;
    }
    bench_attention(b, t, h, h, d, warmup, iters, options);
    if (!no_extra) {  // the same case on the mma.sync kernels, for comparison
        mt::ops::AttentionOptions mma = options;
        mma.kernel = mt::ops::AttentionKernel::mma;
        bench_attention(b, t, h, h, d, warmup, iters, mma);
    }
    // The other two attention shapes (the rows of tools/reference/bench_attention_torch.py), also with
    // --no-extra.
    bench_attention(b, t, 2 * h, 2 * h, 64, warmup, iters, options);             // the same FLOPs at D = 64
    bench_attention(b, t, h, h / 4 > 0 ? h / 4 : 1, d, warmup, iters, options);  // GQA, groups of 4
    if (!no_extra) {
        bench_linear(4 * t, 2048, 2048, warmup, iters);
        bench_linear(4 * t, 2048, 8192, warmup, iters);
        bench_linear(8192, 8192, 8192, warmup, iters);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attention: error: %s\n", e.what());
        return 1;
    }
}
