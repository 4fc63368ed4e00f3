// GPU throughput of the CUDA KDA op (ops/kda.h, chunked, chunk 64): one JSON line per case, forward and
// forward + backward time (median over the timed iterations, CUDA events on the ops' stream) and tokens/s.
//   bench_kda [--iters 5] [--warmup 1] [--h 16] [--k 128] [--v 128] [--keep states_bf16,none,tiles,states,all]
//             [--fp32-kernels] [--no-chunk-smem] [--scan-bv N] [--rscan-bv N]
// The last four set ops::KdaKernels (A/B comparisons of the kernel variants); `impl` names what each call ran.
// --doc-tokens N (default 2048; 0 skips): document masking on one 32768-token row of N-token documents
// (KdaOptions::doc_start), one line per path ("bench": "kda_documents"): packed (the varlen path: one set of launches),
// split (one set of launches per document) and one_document (no map: the floor), with speedup_vs_split.
// --keep: what the forward keeps for the backward (ops::KdaSaved), one line per case and choice: states_bf16 (the
// per-chunk states and Vn alone, in bf16: kda.save = "states_bf16"), none (the backward recomputes everything; the
// layer's default, "none"), tiles (A, M, T: "tiles"), states (also the per-chunk states and Vn in f32,
// "states") or all (also Gamma, Qg, Kg, W: no forward kernel in the backward, "workspace"). Each line also has the
// bytes kept per token and value head and the peak of the device memory handed out during a forward + backward
// above what was in use before it (inputs and outputs excluded: the kept tensors and every workspace), in bytes
// per token and value head and in GiB.
// Cases (issue 4): bf16 activations, f32 states, (B, T) = (8, 4096), (1, 32768), (2, 65536), with the targets for
// forward + backward of 6.0, 8.0 and 27 ms. Inputs: L2-normalised q (scaled by K^-1/2) and k, v in [-2, 2), beta in
// (0.05, 0.95), the lower-bounded gate g = -5 sigmoid(z); the host draws one 4096-token block and tiles it.
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
#include "ops/kda.h"

#ifdef MT_HAVE_CUDA
#include "core/blas_kernels.h"
#include "core/cuda/cuda_check.h"
#endif

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

constexpr int64_t kBlockTokens = 4096;

// Uniform [0, 1) by xorshift.
struct Rng {
    uint64_t s;
    float next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return static_cast<float>(s >> 40) / static_cast<float>(1 << 24);
    }
};

// A bf16 device tensor [B, T, heads, dim] from one drawn [4096, heads, dim] block repeated along tokens; kind picks
// the values: 0 = uniform [-2, 2), 1 = rows L2-normalised to `scale`, 2 = -5 sigmoid(N-ish), 3 = beta (0.05, 0.95).
Tensor make_input(int64_t b, int64_t t, int64_t heads, int64_t dim, int kind, float scale, uint64_t seed) {
    Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
    const int64_t row = heads * dim, block = kBlockTokens * row;
    std::vector<float> vals(static_cast<size_t>(block));
    for (auto& x : vals) x = 4.0f * rng.next() - 2.0f;
    if (kind == 1) {
        for (int64_t r = 0; r < kBlockTokens * heads; ++r) {
            float ss = 0.0f;
            for (int64_t i = 0; i < dim; ++i) ss += vals[r * dim + i] * vals[r * dim + i];
            const float f = scale / std::sqrt(ss + 1e-6f);
            for (int64_t i = 0; i < dim; ++i) vals[r * dim + i] *= f;
        }
    } else if (kind == 2) {
        for (auto& x : vals) x = -5.0f / (1.0f + std::exp(-2.0f * x));
    } else if (kind == 3) {
        for (auto& x : vals) x = 0.05f + 0.9f * (x + 2.0f) / 4.0f;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(block));
    for (int64_t i = 0; i < block; ++i) bits[i] = mt::core::f32_to_bf16(vals[i]);
    const int64_t total = b * t * row;
    std::vector<uint16_t> host(static_cast<size_t>(total));
    for (int64_t off = 0; off < total; off += block)
        std::copy(bits.begin(), bits.begin() + std::min(block, total - off), host.begin() + off);
    const mt::core::Shape shape = dim == 1 ? mt::core::Shape{b, t, heads} : mt::core::Shape{b, t, heads, dim};
    return Tensor::borrow(host.data(), shape, DType::bf16).to_device(Device::cuda);
}

using mt::bench::all_finite;
using mt::bench::time_ms;

void bench_case(int64_t b,
                int64_t t,
                int64_t h,
                int64_t kd,
                int64_t vd,
                double target_ms,
                const std::string& keep,
                const mt::ops::KdaKernels& kernels,
                int warmup,
                int iters) {
    const Tensor q = make_input(b, t, h, kd, 1, 1.0f / std::sqrt(static_cast<float>(kd)), 1);
    const Tensor k = make_input(b, t, h, kd, 1, 1.0f, 2);
    const Tensor v = make_input(b, t, h, vd, 0, 1.0f, 3);
    const Tensor g = make_input(b, t, h, kd, 2, 1.0f, 4);
    const Tensor beta = make_input(b, t, h, 1, 3, 1.0f, 5);
    const Tensor dout = make_input(b, t, h, vd, 0, 1.0f, 6);
    const Tensor out = Tensor::zeros(v.shape(), DType::bf16, Device::cuda);
    const Tensor st = Tensor::zeros({b, h, kd, vd}, DType::f32, Device::cuda);
    const Tensor dst = Tensor::zeros({b, h, kd, vd}, DType::f32, Device::cuda);
    const Tensor dq = Tensor::zeros(q.shape(), DType::bf16, Device::cuda);
    const Tensor dk = Tensor::zeros(k.shape(), DType::bf16, Device::cuda);
    const Tensor dv = Tensor::zeros(v.shape(), DType::bf16, Device::cuda);
    const Tensor dg = Tensor::zeros(g.shape(), DType::bf16, Device::cuda);
    const Tensor dbeta = Tensor::zeros(beta.shape(), DType::bf16, Device::cuda);
    mt::ops::KdaOptions options;
    options.save_states = keep == "states";
    options.save_workspace = keep == "all";
    options.save_states_bf16 = keep == "states_bf16";
    options.kernels = kernels;
    std::string fwd_impl, bwd_impl;
    mt::ops::KdaSaved saved;
    mt::ops::KdaSaved* kept = keep == "none" ? nullptr : &saved;
    auto fwd = [&] { mt::ops::kda_fwd(q, k, v, g, beta, Tensor(), out, st, options, kept); };
    auto bwd = [&] {
        mt::ops::kda_bwd(q, k, v, g, beta, Tensor(), dout, dst, dq, dk, dv, dg, dbeta, Tensor(), options, kept);
        saved = mt::ops::KdaSaved{};  // as the layer does: freed after its backward
    };
    options.chosen = &fwd_impl;
    fwd();
    options.chosen = &bwd_impl;
    bwd();
    options.chosen = nullptr;
    const double fwd_ms = time_ms(fwd, warmup, iters);
    const double fwd_bwd_ms = time_ms(
        [&] {
            fwd();
            bwd();
        },
        warmup,
        iters);
    // The peak of one forward + backward above what was in use before it.
    mt::core::Backend& be = mt::core::backend_get(Device::cuda);
    be.synchronize();
    const size_t in_use = be.bytes_in_use();
    be.reset_peak();
    fwd();
    bwd();
    be.synchronize();
    const double peak_extra = static_cast<double>(be.peak_bytes() - in_use);
    const bool finite = all_finite(out) && all_finite(st) && all_finite(dq) && all_finite(dk) && all_finite(dv) &&
                        all_finite(dg) && all_finite(dbeta);
    const double tokens = static_cast<double>(b * t);
    fwd();  // what one forward keeps, per token and value head
    auto bytes = [](const Tensor& x) { return x.defined() ? static_cast<double>(x.nbytes()) : 0.0; };
    double kept_bytes = 0.0;
    for (const Tensor* x :
         {&saved.a, &saved.m, &saved.t, &saved.hs, &saved.vn, &saved.gam, &saved.qg, &saved.kg, &saved.w})
        kept_bytes += bytes(*x);
    saved = mt::ops::KdaSaved{};
    const nlohmann::json line = {{"bench", "kda"},
                                 {"impl", "moetrain-cuda-v8 fwd=" + fwd_impl + " bwd=" + bwd_impl},
                                 {"dtype", "bf16 (f32 state)"},
                                 {"gate", "lower_bound -5"},
                                 {"chunk", 64},
                                 {"keep", keep},
                                 {"kept_bytes_per_token_head", kept_bytes / (tokens * static_cast<double>(h))},
                                 {"peak_extra_bytes_per_token_head", peak_extra / (tokens * static_cast<double>(h))},
                                 {"peak_extra_gib", peak_extra / (1024.0 * 1024.0 * 1024.0)},
                                 {"B", b},
                                 {"T", t},
                                 {"H", h},
                                 {"K", kd},
                                 {"V", vd},
                                 {"fwd_ms", fwd_ms},
                                 {"fwd_bwd_ms", fwd_bwd_ms},
                                 {"fwd_tokens_per_s", tokens / fwd_ms * 1e3},
                                 {"fwd_bwd_tokens_per_s", tokens / fwd_bwd_ms * 1e3},
                                 {"target_fwd_bwd_ms", target_ms},
                                 {"meets_target", fwd_bwd_ms <= target_ms},
                                 {"outputs_finite", finite},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

// Document masking on one row of t tokens cut into documents of doc tokens: the packed and the split path and the
// row as one document, forward and forward + backward, bf16 inputs, no initial state, dst zero.
void bench_documents(int64_t t, int64_t doc, int64_t h, int64_t kd, int64_t vd, int warmup, int iters) {
    const int64_t b = 1;
    const Tensor q = make_input(b, t, h, kd, 1, 1.0f / std::sqrt(static_cast<float>(kd)), 1);
    const Tensor k = make_input(b, t, h, kd, 1, 1.0f, 2);
    const Tensor v = make_input(b, t, h, vd, 0, 1.0f, 3);
    const Tensor g = make_input(b, t, h, kd, 2, 1.0f, 4);
    const Tensor beta = make_input(b, t, h, 1, 3, 1.0f, 5);
    const Tensor dout = make_input(b, t, h, vd, 0, 1.0f, 6);
    auto zeros = [](const Tensor& x) { return Tensor::zeros(x.shape(), x.dtype(), Device::cuda); };
    const Tensor out = zeros(v), dq = zeros(q), dk = zeros(k), dv = zeros(v), dg = zeros(g), dbeta = zeros(beta);
    const Tensor st = Tensor::zeros({b, h, kd, vd}, DType::f32, Device::cuda), dst = zeros(st);
    std::vector<int32_t> starts(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) starts[static_cast<size_t>(i)] = static_cast<int32_t>(i / doc * doc);
    const Tensor doc_start = Tensor::borrow(starts.data(), {b, t}, DType::i32).to_device(Device::cuda);
    struct Path {
        const char* name;
        mt::ops::KdaDocuments documents;
        bool map;
        double fwd_ms = 0.0, fwd_bwd_ms = 0.0;
        std::string impl = {};
        bool finite = false;
    };
    Path paths[] = {{"packed", mt::ops::KdaDocuments::packed, true},
                    {"split", mt::ops::KdaDocuments::split, true},
                    {"one_document", mt::ops::KdaDocuments::automatic, false}};
    for (Path& p : paths) {
        mt::ops::KdaOptions options;
        options.documents = p.documents;
        if (p.map) options.doc_start = doc_start;
        auto fwd = [&] { mt::ops::kda_fwd(q, k, v, g, beta, Tensor(), out, st, options); };
        auto bwd = [&] {
            mt::ops::kda_bwd(q, k, v, g, beta, Tensor(), dout, dst, dq, dk, dv, dg, dbeta, Tensor(), options);
        };
        options.chosen = &p.impl;
        fwd();
        options.chosen = nullptr;
        bwd();
        p.fwd_ms = time_ms(fwd, warmup, iters);
        p.fwd_bwd_ms = time_ms(
            [&] {
                fwd();
                bwd();
            },
            warmup,
            iters);
        p.finite = all_finite(out) && all_finite(st) && all_finite(dq) && all_finite(dk) && all_finite(dv) &&
                   all_finite(dg) && all_finite(dbeta);
    }
    const double split_ms = paths[1].fwd_bwd_ms;
    for (const Path& p : paths) {
        const nlohmann::json line = {{"bench", "kda_documents"},
                                     {"path", p.name},
                                     {"impl", p.impl},
                                     {"dtype", "bf16 (f32 state)"},
                                     {"chunk", 64},
                                     {"B", b},
                                     {"T", t},
                                     {"doc_tokens", p.map ? doc : t},
                                     {"documents", p.map ? (t + doc - 1) / doc : 1},
                                     {"H", h},
                                     {"K", kd},
                                     {"V", vd},
                                     {"fwd_ms", p.fwd_ms},
                                     {"fwd_bwd_ms", p.fwd_bwd_ms},
                                     {"speedup_vs_split", p.fwd_bwd_ms > 0.0 ? split_ms / p.fwd_bwd_ms : 0.0},
                                     {"outputs_finite", p.finite},
                                     {"iters", iters}};
        std::printf("%s\n", line.dump().c_str());
    }
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain CUDA KDA benchmark"};
    int64_t h = 16, kd = 128, vd = 128;
    int iters = 5, warmup = 1;
    int64_t doc_tokens = 2048;
    std::vector<std::string> keeps = {"states_bf16", "none", "tiles", "states", "all"};
    app.add_option("--h", h);
    app.add_option("--k", kd);
    app.add_option("--v", vd);
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_option("--doc-tokens", doc_tokens, "document length of the document-masking cases, 0 = skip them")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--keep", keeps)
        ->delimiter(',')
        ->check(CLI::IsMember({"states_bf16", "none", "tiles", "states", "all"}));
    mt::ops::KdaKernels kernels;
    bool fp32_kernels = false, no_chunk_smem = false;
    app.add_flag("--fp32-kernels", fp32_kernels, "run the fp32 kernels on the bf16 inputs (KdaKernels::tensor_cores)");
    app.add_flag("--no-chunk-smem", no_chunk_smem, "the general backward chunk kernel (KdaKernels::chunk_smem)");
    app.add_option("--scan-bv", kernels.scan_bv, "forward scan value tile, 0 = per shape")
        ->check(CLI::IsMember({0, 16, 32, 64, 128}));
    app.add_option("--rscan-bv", kernels.rscan_bv, "reverse scan value tile, 0 = per shape")
        ->check(CLI::IsMember({0, 16, 32, 64, 128}));
    CLI11_PARSE(app, argc, argv);
    kernels.tensor_cores = !fp32_kernels;
    kernels.chunk_smem = !no_chunk_smem;
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "kda"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    for (const std::string& keep : keeps) {
        bench_case(8, 4096, h, kd, vd, 6.0, keep, kernels, warmup, iters);
        bench_case(1, 32768, h, kd, vd, 8.0, keep, kernels, warmup, iters);
        bench_case(2, 65536, h, kd, vd, 27.0, keep, kernels, warmup, iters);
    }
    if (doc_tokens > 0) bench_documents(32768, doc_tokens, h, kd, vd, warmup, iters);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_kda: error: %s\n", e.what());
        return 1;
    }
}
