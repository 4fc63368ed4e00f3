// GPU throughput of Muon's Newton-Schulz (ops::newton_schulz, bf16 cuBLASLt GEMMs with fp32 accumulation, three
// strided-batched calls per step over the E matrices) and of the whole step (ops::muon_step: f32 param and momentum,
// bf16 grad). One JSON line per case and op (median over the timed iterations, CUDA events on the ops' stream).
//   bench_muon [--iters 10] [--warmup 3] [--ns-steps 5] [--hybrid]
// Cases: stacks of 64 and 256 experts of 1024 x 2048 and of 2048 x 1408 (a tall matrix: the products run on its
// transpose), and single 2048 x 2048 and 4096 x 4096 matrices.
// FLOPs per matrix of A x B, p = min(A, B), q = max(A, B): n_steps (4 p^2 q + 2 p^3) (G = X X^T: 2 p^2 q, G G: 2 p^3,
// P X: 2 p^2 q), times E for a stack; muon_step's TFLOP/s counts the same FLOPs (its elementwise passes add none).
// peak_bytes: the caching allocator's peak over the case (inputs, outputs, work buffers, cuBLASLt's workspace);
// workspace_bytes: that peak less the case's own tensors.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "ops/muon.h"

namespace {

using mt::bench::all_finite;
using mt::bench::random_bf16;
using mt::bench::time_ms;
using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

double ns_flops(int64_t e, int64_t a, int64_t b, int steps) {
    const double p = static_cast<double>(std::min(a, b)), q = static_cast<double>(std::max(a, b));
    return static_cast<double>(e) * steps * (4.0 * p * p * q + 2.0 * p * p * p);
}

bool ends_finite(const Tensor& t) {
    return all_finite(t.select(0, 0)) && all_finite(t.select(0, t.size(0) - 1));
}

nlohmann::json case_fields(const std::string& bench, int64_t e, int64_t a, int64_t b, const mt::ops::MuonHyper& h) {
    return {{"bench", bench},
            {"E", e},
            {"A", a},
            {"B", b},
            {"p", std::min(a, b)},
            {"q", std::max(a, b)},
            {"ns_steps", h.total_steps()},
            {"coeffs", h.hybrid ? "hybrid" : "quintic"},
            {"gemm_launches", 3 * h.total_steps()}};
}

void print(const nlohmann::json& line) {
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

void bench_ns(int64_t e, int64_t a, int64_t b, const mt::ops::MuonHyper& h, int warmup, int iters) {
    mt::core::Backend& be = mt::core::backend_get(Device::cuda);
    be.synchronize();
    be.reset_peak();
    const size_t before = be.bytes_in_use();
    const Tensor x = random_bf16({e, a, b}, 7);
    const Tensor out = Tensor::zeros({e, a, b}, DType::bf16, Device::cuda);
    const double ms = time_ms([&] { mt::ops::newton_schulz(x, out, h); }, warmup, iters);
    const size_t own = x.nbytes() + out.nbytes();
    nlohmann::json line = case_fields("newton_schulz", e, a, b, h);
    line.update({{"impl", "moetrain-cuda (cuBLASLt strided-batched bf16, fp32 accumulation)"},
                 {"dtype", "bf16"},
                 {"ms", ms},
                 {"tflops", ns_flops(e, a, b, h.total_steps()) / ms * 1e-9},
                 {"peak_bytes", be.peak_bytes() - before},
                 {"workspace_bytes", be.peak_bytes() - before - own},
                 {"outputs_finite", ends_finite(out)},
                 {"iters", iters}});
    print(line);
}

void bench_step(int64_t e, int64_t a, int64_t b, const mt::ops::MuonHyper& h, int warmup, int iters) {
    mt::core::Backend& be = mt::core::backend_get(Device::cuda);
    be.synchronize();
    be.reset_peak();
    const size_t before = be.bytes_in_use();
    const Tensor param = Tensor::zeros({e, a, b}, DType::f32, Device::cuda);  // the timing does not depend on it
    const Tensor grad = random_bf16({e, a, b}, 12);
    const Tensor m = Tensor::zeros({e, a, b}, DType::f32, Device::cuda);
    const Tensor update_sq = Tensor::zeros({1}, DType::f64, Device::cuda);
    const double ms = time_ms([&] { mt::ops::muon_step(param, grad, m, h, 1.0, update_sq); }, warmup, iters);
    const size_t own = param.nbytes() + grad.nbytes() + m.nbytes() + update_sq.nbytes();
    nlohmann::json line = case_fields("muon_step", e, a, b, h);
    line.update({{"impl", "moetrain-cuda (fused f32 elementwise passes + cuBLASLt strided-batched bf16 Newton-Schulz)"},
                 {"dtype", "param, m f32; grad bf16; update_sq on"},
                 {"ms", ms},
                 {"tflops", ns_flops(e, a, b, h.total_steps()) / ms * 1e-9},
                 {"peak_bytes", be.peak_bytes() - before},
                 {"workspace_bytes", be.peak_bytes() - before - own},
                 {"outputs_finite", ends_finite(param) && all_finite(update_sq)},
                 {"iters", iters}});
    print(line);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain Muon (Newton-Schulz) benchmark"};
    int iters = 10, warmup = 3, ns_steps = 5;
    bool hybrid = false;
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    app.add_option("--ns-steps", ns_steps);
    app.add_flag("--hybrid", hybrid, "8 quintic steps, then 2 of (2, -1.5, 0.5)");
    CLI11_PARSE(app, argc, argv);
    if (!mt::core::backend_available(Device::cuda)) {
        print({{"bench", "muon"}, {"skipped", "no CUDA device"}});
        return 0;
    }
    mt::ops::MuonHyper h;
    h.ns_steps = ns_steps;
    h.hybrid = hybrid;
    struct Case {
        int64_t e, a, b;
    };
    for (const Case& c : {Case{64, 1024, 2048},
                          Case{256, 1024, 2048},
                          Case{64, 2048, 1408},
                          Case{256, 2048, 1408},
                          Case{1, 2048, 2048},
                          Case{1, 4096, 4096}}) {
        bench_ns(c.e, c.a, c.b, h, warmup, iters);
        bench_step(c.e, c.a, c.b, h, warmup, iters);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_muon: %s\n", e.what());
        return 1;
    }
}
