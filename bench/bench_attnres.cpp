// GPU throughput of the Block AttnRes mix (ops/attnres_mix.h): one JSON line per case, forward and backward time
// (median over the timed iterations, CUDA events on the ops' stream) and the bandwidth of the bytes each must move.
//   bench_attnres [--iters 20] [--warmup 3] [--n 8192] [--c 1536] [--m 2,3,5] [--dv f32,bf16]
// Cases (issue 25): kimi_linear_mini's mixes, batch 2 x 4096 tokens at d_model 1536, bf16 sources and dh, f32
// query and key_gain, m = 2, 3, 5 sources, d_sources f32 (the layer's accumulators) or bf16.
// Bytes: forward reads the m sources and writes h and alpha; backward reads the m sources, dh and alpha and reads and
// writes the m d_sources (query, gain and the per-chunk partial sums are below 1% and not counted). A kernel that
// re-reads a row from memory rather than from cache moves more than this, so gb_s is a lower bound of its traffic.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "ops/attnres_mix.h"

namespace {

using mt::bench::all_finite;
using mt::bench::random_bf16;
using mt::bench::time_ms;
using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

void bench_case(int64_t n, int64_t c, int64_t m, DType dv_dtype, int warmup, int iters) {
    std::vector<Tensor> sources, d_sources;
    for (int64_t j = 0; j < m; ++j) {
        sources.push_back(random_bf16({n, c}, 10 + static_cast<uint64_t>(j), 1.0f + 0.3f * static_cast<float>(j)));
        d_sources.push_back(Tensor::zeros({n, c}, dv_dtype, Device::cuda));
    }
    const Tensor query = random_bf16({c}, 1, 0.25f).to(DType::f32), gain = random_bf16({c}, 2, 0.1f).to(DType::f32);
    const Tensor dh = random_bf16({n, c}, 3);
    const Tensor h = Tensor::zeros({n, c}, DType::bf16, Device::cuda);
    const Tensor alpha = Tensor::zeros({n, m}, DType::f32, Device::cuda);
    const Tensor dquery = Tensor::zeros({c}, DType::f32, Device::cuda),
                 dgain = Tensor::zeros({c}, DType::f32, Device::cuda);
    auto fwd = [&] { mt::ops::attnres_mix_fwd(sources, query, gain, 1e-6, h, alpha); };
    auto bwd = [&] { mt::ops::attnres_mix_bwd(sources, query, gain, 1e-6, alpha, dh, d_sources, dquery, dgain); };
    fwd();
    const double fwd_ms = time_ms(fwd, warmup, iters);
    const double bwd_ms = time_ms(bwd, warmup, iters);
    bool finite = all_finite(h) && all_finite(alpha) && all_finite(dquery) && all_finite(dgain);
    for (const Tensor& dv : d_sources) finite = finite && all_finite(dv);
    const double row = static_cast<double>(n * c), src_bytes = 2.0 * row * static_cast<double>(m);
    const double alpha_bytes = 4.0 * static_cast<double>(n * m);
    const double fwd_bytes = src_bytes + 2.0 * row + alpha_bytes;
    const double bwd_bytes = src_bytes + 2.0 * row + alpha_bytes +
                             2.0 * static_cast<double>(mt::core::dtype_size(dv_dtype)) * row * static_cast<double>(m);
    const nlohmann::json line = {{"bench", "attnres_mix"},
                                 {"impl", "moetrain-cuda warp-per-row v2"},
                                 {"dtype", "bf16 (query f32)"},
                                 {"d_sources", mt::core::dtype_name(dv_dtype)},
                                 {"N", n},
                                 {"C", c},
                                 {"m", m},
                                 {"fwd_ms", fwd_ms},
                                 {"bwd_ms", bwd_ms},
                                 {"fwd_bytes", fwd_bytes},
                                 {"bwd_bytes", bwd_bytes},
                                 {"fwd_gb_s", fwd_bytes / fwd_ms * 1e-6},
                                 {"bwd_gb_s", bwd_bytes / bwd_ms * 1e-6},
                                 {"outputs_finite", finite},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain CUDA Block AttnRes mix benchmark"};
    int64_t n = 8192, c = 1536;
    std::vector<int64_t> ms = {2, 3, 5};
    std::vector<std::string> dvs = {"f32"};
    int iters = 20, warmup = 3;
    app.add_option("--n", n, "tokens")->check(CLI::PositiveNumber);
    app.add_option("--c", c, "d_model")->check(CLI::PositiveNumber);
    app.add_option("--m", ms, "source counts")->delimiter(',')->check(CLI::Range(int64_t{1}, int64_t{32}));
    app.add_option("--dv", dvs, "d_sources dtypes")->delimiter(',')->check(CLI::IsMember({"f32", "bf16"}));
    app.add_option("--iters", iters);
    app.add_option("--warmup", warmup);
    CLI11_PARSE(app, argc, argv);
    if (!mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "attnres_mix"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    for (const std::string& dv : dvs)
        for (int64_t m : ms) bench_case(n, c, m, dv == "f32" ? DType::f32 : DType::bf16, warmup, iters);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attnres: error: %s\n", e.what());
        return 1;
    }
}
