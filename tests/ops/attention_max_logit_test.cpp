// The optional max pre-softmax logit of attention_fwd (ops/attention.h max_logit; long_context.md §9, read by QK-clip):
// the CPU reference against the maximum written out directly over each row's visible keys (f64, exact up to the
// dot products' rounding), with a key prefix, a window and a document map; leaving it out changes nothing; bad shapes
// and dtypes are refused. On the GPU every forward family (wgmma, mma.sync, generic in bf16 and f32) against the CPU
// f32 reference on the same rounded inputs, with and without a prefix, window and map (gpu label).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_here.h"
#include "core/backend.h"
#include "ops/attention.h"
#include "ops/op_harness.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

// Row 0: documents from 0, inside the prefix, among the queries and at the last position; row 1: one document.
Tensor doc_map(int64_t b, int64_t t, int64_t tk) {
    const int64_t off = tk - t;
    std::vector<int64_t> row0 = {0};
    for (int64_t s : {off / 2 + 1, off + t / 3, tk - 1})
        if (s > row0.back() && s < tk) row0.push_back(s);
    std::vector<std::vector<int64_t>> starts = {row0};
    for (int64_t i = 1; i < b; ++i) starts.push_back({0});
    return mt::testing::doc_start_map(starts, tk);
}

// max over the keys j that query i (at position tk - t + i) sees of q . k_j / sqrt(d), written out directly.
Tensor direct_max_logit(const Tensor& q, const Tensor& k, const Tensor& doc_start, int64_t window) {
    const int64_t b = q.size(0), t = q.size(1), hq = q.size(2), d = q.size(3), tk = k.size(1), hkv = k.size(2);
    Tensor m = Tensor::zeros({b, hq, t}, DType::f64);
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t i = 0; i < t; ++i) {
                const int64_t pos = tk - t + i, kh = h / (hq / hkv);
                const int64_t doc = doc_start.defined() ? static_cast<int64_t>(doc_start.at({bb, pos})) : 0;
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t j = 0; j <= pos; ++j) {
                    if (j < doc || (window > 0 && pos - j >= window)) continue;
                    double dot = 0;
                    for (int64_t c = 0; c < d; ++c) dot += q.at({bb, i, h, c}) * k.at({bb, j, kh, c});
                    mx = std::max(mx, dot / std::sqrt(static_cast<double>(d)));
                }
                core::tensor_set_flat(m, (bb * hq + h) * t + i, mx);
            }
    return m;
}

TEST(AttentionMaxLogit, MatchesTheDirectMaximum) {
    const int64_t b = 2, hq = 4, hkv = 2, d = 6;
    int cases = 0;
    const std::vector<std::pair<int64_t, int64_t>> sizes = {{30, 30}, {37, 100}, {1, 50}};  // (T, Tk)
    for (const auto& [t, tk] : sizes)
        for (int64_t window : {int64_t{0}, int64_t{9}})
            for (bool docs : {false, true}) {
                SCOPED_TRACE(fmt::format("t {} tk {} window {} docs {}", t, tk, window, docs));
                const Tensor q = op_randn({b, t, hq, d}, 70, 0), k = op_randn({b, tk, hkv, d}, 70, 1);
                const Tensor v = op_randn({b, tk, hkv, d}, 70, 2);
                const AttentionMask mask{.doc_start = docs ? doc_map(b, t, tk) : Tensor(), .window = window};
                Tensor out = op_like(q), lse = Tensor::zeros({b, hq, t}, DType::f64);
                Tensor max_logit = Tensor::zeros({b, hq, t}, DType::f64);
                attention_fwd(q, k, v, out, lse, {}, mask, max_logit);
                const Tensor ref = direct_max_logit(q, k, mask.doc_start, window);
                for (int64_t i = 0; i < ref.numel(); ++i)
                    EXPECT_NEAR(core::tensor_get_flat(max_logit, i), core::tensor_get_flat(ref, i), 1e-12) << i;
                // Without it, out and lse are bitwise the same; lse >= max_logit (the max key's own term).
                Tensor out2 = op_like(q), lse2 = Tensor::zeros({b, hq, t}, DType::f64);
                attention_fwd(q, k, v, out2, lse2, {}, mask);
                EXPECT_EQ(std::memcmp(out.raw(), out2.raw(), out.nbytes()), 0);
                EXPECT_EQ(std::memcmp(lse.raw(), lse2.raw(), lse.nbytes()), 0);
                for (int64_t i = 0; i < ref.numel(); ++i)
                    EXPECT_GE(core::tensor_get_flat(lse, i), core::tensor_get_flat(max_logit, i));
                ++cases;
            }
    EXPECT_EQ(cases, 12);
}

TEST(AttentionMaxLogit, RefusesBadShapesAndDtypes) {
    const Tensor q = op_randn({1, 5, 2, 4}, 3, 0), k = op_randn({1, 8, 1, 4}, 3, 1);
    Tensor out = op_like(q), lse = Tensor::zeros({1, 2, 5}, DType::f64);
    EXPECT_THROW(attention_fwd(q, k, k, out, lse, {}, {}, Tensor::zeros({1, 2, 8}, DType::f64)), core::Error);
    EXPECT_THROW(attention_fwd(q, k, k, out, lse, {}, {}, Tensor::zeros({1, 2, 5}, DType::f32)), core::Error);
}

// ---- GPU: every forward family against the CPU f32 reference ----

Tensor host64(const Tensor& x) {
    return x.to_device(core::Device::cpu).to(DType::f64);
}

// max_logit (and out, lse beside it) of the CUDA forward with inputs of `dtype` against the CPU f32 reference; every
// output starts as NaN, so an element never written fails.
void max_logit_gpu_parity(int64_t t,
                          int64_t tk,
                          int64_t d,
                          int64_t window,
                          bool docs,
                          DType dtype,
                          AttentionKernel kernel,
                          const char* expect) {
    const int64_t b = 2, hq = 4, hkv = 2;
    const std::string name = fmt::format(
        "max_logit_t{}_tk{}_d{}_w{}{}_{}_{}", t, tk, d, window, docs ? "_docs" : "", core::dtype_name(dtype), expect);
    const uint64_t s = op_seed(name);
    auto rounded = [&](const Tensor& x) { return x.to(dtype).to(DType::f32); };
    auto gpu = [&](const Tensor& x) { return x.to(dtype).to_device(core::Device::cuda); };
    const Tensor q = rounded(op_randn({b, t, hq, d}, s, 0)), k = rounded(op_randn({b, tk, hkv, d}, s, 1));
    const Tensor v = rounded(op_randn({b, tk, hkv, d}, s, 2));
    const Tensor map = docs ? doc_map(b, t, tk) : Tensor();
    Tensor out = op_like(q), lse = Tensor::zeros({b, hq, t}, DType::f32), ml = Tensor::zeros({b, hq, t}, DType::f32);
    attention_fwd(q, k, v, out, lse, {}, {.doc_start = map, .window = window}, ml);
    auto nan_cuda = [](const Shape& shape, DType dt) {
        const Tensor x = Tensor::zeros(shape, dt, core::Device::cuda);
        x.fill(std::nan(""));
        return x;
    };
    const Tensor og = nan_cuda(q.shape(), dtype), lg = nan_cuda({b, hq, t}, DType::f32);
    const Tensor mg = nan_cuda({b, hq, t}, DType::f32);
    std::string chosen;
    AttentionOptions options;
    options.kernel = kernel;
    options.chosen = &chosen;
    const AttentionMask gpu_mask{.doc_start = docs ? map.to_device(core::Device::cuda) : Tensor(), .window = window};
    attention_fwd(gpu(q), gpu(k), gpu(v), og, lg, options, gpu_mask, mg);
    EXPECT_EQ(chosen, expect) << name;
    // The scores come from the same rounded inputs with fp32 sums: max_logit is held to 1e-3 in bf16, out and lse to
    // the budget of the other attention tests.
    const double budget = dtype == DType::f32 ? 1e-5 : 1e-2;
    const std::pair<const char*, std::pair<Tensor, Tensor>> checks[] = {
        {"max_logit", {mg, ml}}, {"lse", {lg, lse}}, {"out", {og, out}}};
    for (const auto& [what, pair] : checks) {
        const double r = mt::testing::rho(host64(pair.first), host64(pair.second));
        const double limit = std::strcmp(what, "max_logit") == 0 ? std::min(budget, 1e-3) : budget;
        std::printf("[ GPU PARITY ] %s %s: rho %.3e (budget %.0e)\n", name.c_str(), what, r, limit);
        EXPECT_LE(r, limit) << name << " " << what;
    }
}

void max_logit_cases(int64_t d, DType dtype, AttentionKernel kernel, const char* expect) {
    max_logit_gpu_parity(300, 300, d, 0, false, dtype, kernel, expect);
    max_logit_gpu_parity(300, 300, d, 70, true, dtype, kernel, expect);
    max_logit_gpu_parity(37, 100, d, 0, false, dtype, kernel, expect);
    max_logit_gpu_parity(37, 100, d, 50, true, dtype, kernel, expect);
    max_logit_gpu_parity(128, 320, d, 0, true, dtype, kernel, expect);
}

TEST(GpuAttentionMaxLogit, EveryFamilyMatchesTheCpu) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    for (int64_t d : {64, 72, 128}) {
        if (attention_wgmma_here()) max_logit_cases(d, DType::bf16, AttentionKernel::wgmma, "cuda-wgmma");
        max_logit_cases(d, DType::bf16, AttentionKernel::mma, "cuda-mma");
    }
    max_logit_cases(64, DType::bf16, AttentionKernel::generic, "cuda-generic");
    max_logit_cases(48, DType::f32, AttentionKernel::automatic, "cuda-generic");
}

TEST(GpuAttentionMaxLogit, RefusesAnotherDtype) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const Tensor q = Tensor::zeros({1, 4, 1, 64}, DType::bf16, core::Device::cuda);
    const Tensor lse = Tensor::zeros({1, 1, 4}, DType::f32, core::Device::cuda);
    const Tensor bad = Tensor::zeros({1, 1, 4}, DType::bf16, core::Device::cuda);
    const Tensor out = Tensor::zeros(q.shape(), DType::bf16, core::Device::cuda);
    EXPECT_THROW(attention_fwd(q, q, q, out, lse, {}, {}, bad), core::Error);
}

}  // namespace
}  // namespace mt::ops::test
