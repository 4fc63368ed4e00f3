// The CUDA causal conv beyond the harness cases (which round every input to one dtype): every combination of the x, w
// and dw dtypes against the CPU f32 reference on the same rounded values, with per-row document maps whose starts sit
// on and beside the kernels' thread (64-token) and block (256-token) tiles; the backward run twice gives the same bits
// (dw's partial sums are added in a fixed order); widths above 8 are refused. Label gpu (Gpu* suites).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/backend.h"
#include "op_harness.h"
#include "ops/causal_conv1d.h"
#include "support/documents.h"

namespace mt::ops::test {
namespace {

constexpr const char* kNoGpu = "no CUDA device: GPU tests need a GPU";

struct Problem {
    int64_t b, t, c, width;
    std::vector<std::vector<int64_t>> starts;  // one list per row; empty: no document map
};

const Problem kProblems[] = {
    {2, 300, 130, 4, {{0, 1, 2, 63, 64, 65, 255, 256, 257}, {0, 191}}},  // 2-channel words
    {1, 333, 33, 4, {{0, 128, 129, 300}}},                               // odd C: one channel a thread
    {3, 70, 10, 7, {}},                                                  // the 8-tap window
};

Tensor on_cuda(const Tensor& host, DType dtype) {
    return host.to(dtype).to_device(core::Device::cuda);
}

// The host f32 copy of a tensor rounded to dtype: the CPU reference's view of a device input.
Tensor rounded(const Tensor& host, DType dtype) {
    return host.to(dtype).to(DType::f32);
}

void expect_dtypes_match_the_cpu(const Problem& p, DType tx, DType tw, DType tg, bool silu) {
    const std::string name = fmt::format("conv b{} t{} c{} w{} x {} w {} dw {}{}",
                                         p.b,
                                         p.t,
                                         p.c,
                                         p.width,
                                         core::dtype_name(tx),
                                         core::dtype_name(tw),
                                         core::dtype_name(tg),
                                         silu ? " silu" : "");
    const uint64_t seed = op_seed(name);
    const Tensor x = op_randn({p.b, p.t, p.c}, seed, 0), w = op_randn({p.c, p.width}, seed, 1, 0.0, 0.5);
    const Tensor dy = op_randn({p.b, p.t, p.c}, seed, 2);
    const Tensor docs = p.starts.empty() ? Tensor() : mt::testing::doc_start_map(p.starts, p.t);
    // CPU f32 on the rounded values.
    const Tensor xr = rounded(x, tx), wr = rounded(w, tw), dyr = rounded(dy, tx);
    const Tensor y_ref = op_like(xr), dx_ref = op_like(xr), dw_ref = op_like(wr);
    causal_conv1d_fwd(xr, wr, y_ref, silu, docs);
    causal_conv1d_bwd(xr, wr, dyr, dx_ref, dw_ref, silu, docs);
    // CUDA; dx starts as NaN (written), dw as zero (accumulated: the harness cases check the +=).
    const Tensor xg = on_cuda(x, tx), wg = on_cuda(w, tw), dyg = on_cuda(dy, tx);
    const Tensor docs_g = docs.defined() ? docs.to_device(core::Device::cuda) : Tensor();
    const Tensor yg = Tensor::zeros(xg.shape(), tx, core::Device::cuda),
                 dxg = Tensor::zeros(xg.shape(), tx, core::Device::cuda);
    const Tensor dwg = Tensor::zeros(wg.shape(), tg, core::Device::cuda);
    dxg.fill(std::nan(""));
    causal_conv1d_fwd(xg, wg, yg, silu, docs_g);
    causal_conv1d_bwd(xg, wg, dyg, dxg, dwg, silu, docs_g);
    // f32 math on the same values: the f32 budget unless the result is rounded to a half dtype.
    const double x_budget = tx == DType::f32 ? 1e-5 : 1e-2,
                 dw_budget = tx == DType::f32 && tg == DType::f32 ? 1e-5 : 1e-2;
    op_expect_parity(name, "y", yg, y_ref, x_budget);
    op_expect_parity(name, "dx", dxg, dx_ref, x_budget);
    op_expect_parity(name, "dw", dwg, dw_ref, dw_budget);
}

TEST(GpuCausalConv1d, EveryDtypeCombinationMatchesTheCpu) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << kNoGpu;
    for (const Problem& p : kProblems)
        for (DType tx : {DType::bf16, DType::f16, DType::f32})
            for (DType tw : {DType::bf16, DType::f16, DType::f32})
                for (DType tg : {DType::bf16, DType::f16, DType::f32})
                    for (bool silu : {true, false}) expect_dtypes_match_the_cpu(p, tx, tw, tg, silu);
}

// Forward and backward twice on the same inputs: the same bits (no float atomics; dw's partials in a fixed order).
TEST(GpuCausalConv1d, Deterministic) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << kNoGpu;
    const int64_t b = 3, t = 1500, c = 514;
    const Tensor x = on_cuda(op_randn({b, t, c}, 11, 0), DType::bf16),
                 w = on_cuda(op_randn({c, 4}, 11, 1), DType::bf16);
    const Tensor dy = on_cuda(op_randn({b, t, c}, 11, 2), DType::bf16);
    const Tensor docs = mt::testing::doc_start_map({{0, 700}, {0}, {0, 5, 256, 1000}}, t).to_device(core::Device::cuda);
    std::vector<Tensor> runs;
    for (int run = 0; run < 2; ++run) {
        const Tensor y = Tensor::zeros(x.shape(), DType::bf16, core::Device::cuda);
        const Tensor dx = Tensor::zeros(x.shape(), DType::bf16, core::Device::cuda);
        const Tensor dw = Tensor::zeros(w.shape(), DType::f32, core::Device::cuda);
        causal_conv1d_fwd(x, w, y, true, docs);
        causal_conv1d_bwd(x, w, dy, dx, dw, true, docs);
        runs.insert(runs.end(), {y, dx, dw});
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(op_same_bytes(runs[i], runs[i + 3])) << "tensor " << i;
}

TEST(GpuCausalConv1d, RefusesWidthsAboveEight) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << kNoGpu;
    const Tensor x = Tensor::zeros({1, 4, 2}, DType::bf16, core::Device::cuda), y = op_like(x);
    const Tensor w = Tensor::zeros({2, 9}, DType::bf16, core::Device::cuda);
    expect_op_error([&] { causal_conv1d_fwd(x, w, y, true); },
                    "causal_conv1d_fwd: w has width 9 but the CUDA kernels take widths up to 8");
    expect_op_error([&] { causal_conv1d_bwd(x, w, y, op_like(x), op_like(w), true); },
                    "causal_conv1d_bwd: w has width 9 but the CUDA kernels take widths up to 8");
}

}  // namespace
}  // namespace mt::ops::test
