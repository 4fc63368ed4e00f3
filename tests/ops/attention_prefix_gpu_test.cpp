// GPU parity of attention over a key prefix (ops/attention.h, Tk > T: query i at key position Tk - T + i), the
// building block of sequence segments (long_context.md §4): every CUDA kernel family (wgmma with its deterministic and
// its fast backward, mma.sync, generic in bf16 and f32), deterministic on and off, with and without a window and a
// document map over the Tk positions, against the CPU f32 reference on the same rounded inputs. T and Tk are not tile
// multiples (37 of 100, 128 of 320), plus a larger case of tile multiples; the windows and maps leave whole key tiles
// of the prefix unseen, whose dk and dv must be written as exact zeros. Ignoring the prefix (queries at 0..T - 1)
// changes every output, so these fail without it. Bitwise run-to-run determinism of the deterministic kernels too.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention_gpu_here.h"
#include "attention_gpu_parity.h"
#include "core/backend.h"
#include "core/exec.h"
#include "ops/attention.h"
#include "ops/op_harness.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

struct Shape4 {
    int64_t b, t, tk, hq, hkv, d;
};

// Document starts of row 0: one inside the prefix (the keys before it are seen by no query), two among the queries
// (one a tile apart from the first query) and one at the last position; row 1 is one document, so its map is all 0
// (a document that started before the prefix, as a segment's map may be).
Tensor prefix_doc_map(int64_t b, int64_t t, int64_t tk) {
    const int64_t off = tk - t;
    std::vector<int64_t> row0 = {0};
    for (int64_t s : {off / 3 + 3, off + t / 3 + 1, off + (2 * t) / 3, tk - 2})
        if (s > row0.back() && s < tk) row0.push_back(s);
    std::vector<std::vector<int64_t>> starts = {row0};
    for (int64_t i = 1; i < b; ++i) starts.push_back({0});
    return mt::testing::doc_start_map(starts, tk);
}

using attention_gpu::expect_rho;
using attention_gpu::host64;
using attention_gpu::nan_cuda;
using attention_gpu::nondeterministic;
using attention_gpu::run_fwd_bwd;

// Key rows (of [B, Tk, Hkv, D]) that are exactly zero in the reference (keys no query sees) are exactly zero here.
int expect_zero_rows_match(const std::string& name, const char* what, const Tensor& got, const Tensor& ref, int64_t d) {
    const Tensor g = host64(got), r = host64(ref);
    int zero_rows = 0;
    for (int64_t row = 0; row < r.numel() / d; ++row) {
        bool zero = true;
        for (int64_t c = 0; c < d && zero; ++c) zero = core::tensor_get_flat(r, row * d + c) == 0.0;
        if (!zero) continue;
        ++zero_rows;
        for (int64_t c = 0; c < d; ++c)
            EXPECT_EQ(core::tensor_get_flat(g, row * d + c), 0.0) << name << " " << what << " row " << row;
    }
    return zero_rows;
}

// The CUDA forward and backward with inputs of `dtype` against the CPU f32 reference; `expect` names the kernels the
// backward must report. Returns the number of key rows no query sees (exact zeros in dk).
int prefix_gpu_parity(const Shape4& s,
                      int64_t window,
                      bool docs,
                      DType dtype,
                      AttentionKernel kernel,
                      const char* expect,
                      bool fast_bwd = true) {
    const std::string name = fmt::format("prefix_b{}_t{}_tk{}_hq{}_hkv{}_d{}_w{}{}_{}_{}{}",
                                         s.b,
                                         s.t,
                                         s.tk,
                                         s.hq,
                                         s.hkv,
                                         s.d,
                                         window,
                                         docs ? "_docs" : "",
                                         core::dtype_name(dtype),
                                         expect,
                                         core::exec().deterministic ? "" : "_nondeterministic");
    const uint64_t seed = op_seed(name);
    auto rounded = [&](const Tensor& x) { return x.to(dtype).to(DType::f32); };
    auto gpu = [&](const Tensor& x) { return x.to(dtype).to_device(core::Device::cuda); };
    const Tensor q = rounded(op_randn({s.b, s.t, s.hq, s.d}, seed, 0));
    const Tensor k = rounded(op_randn({s.b, s.tk, s.hkv, s.d}, seed, 1));
    const Tensor v = rounded(op_randn({s.b, s.tk, s.hkv, s.d}, seed, 2));
    const Tensor dout = rounded(op_randn({s.b, s.t, s.hq, s.d}, seed, 3));
    const Tensor map = docs ? prefix_doc_map(s.b, s.t, s.tk) : Tensor();
    const std::vector<Tensor> ref = run_fwd_bwd(q, k, v, dout, {.doc_start = map, .window = window}, {});
    std::string chosen;
    AttentionOptions options;
    options.kernel = kernel;
    options.fast_bwd = fast_bwd;
    options.chosen = &chosen;
    const AttentionMask gpu_mask{.doc_start = docs ? map.to_device(core::Device::cuda) : Tensor(), .window = window};
    const std::vector<Tensor> got = run_fwd_bwd(gpu(q), gpu(k), gpu(v), gpu(dout), gpu_mask, options);
    EXPECT_EQ(chosen, expect) << name;
    const double budget = dtype == DType::f32 ? 1e-5 : 1e-2;
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (size_t i = 0; i < ref.size(); ++i) expect_rho(name, names[i], got[i], ref[i], budget);
    const int unseen = expect_zero_rows_match(name, "dk", got[3], ref[3], s.d);
    expect_zero_rows_match(name, "dv", got[4], ref[4], s.d);
    return unseen;
}

// The prefix cases every family runs at head dim d: T and Tk off every tile size, without a mask, with a window (50
// leaves keys 0..13 of 100 unseen; 100 leaves 0..92 of 320 unseen, key tile 0 whole), with the document map (keys
// before its prefix document unseen), and both; then tile multiples, a longer prefix with several query tiles.
void prefix_cases(int64_t d, DType dtype, AttentionKernel kernel, const char* expect, bool fast_bwd = true) {
    int unseen = 0;
    for (const Shape4& s : {Shape4{2, 37, 100, 4, 2, d}, Shape4{2, 128, 320, 2, 1, d}}) {
        const int64_t window = s.t == 37 ? 50 : 100;
        prefix_gpu_parity(s, 0, false, dtype, kernel, expect, fast_bwd);
        unseen += prefix_gpu_parity(s, window, false, dtype, kernel, expect, fast_bwd);
        unseen += prefix_gpu_parity(s, 0, true, dtype, kernel, expect, fast_bwd);
        prefix_gpu_parity(s, window / 2 + 7, true, dtype, kernel, expect, fast_bwd);
    }
    const Shape4 big{1, 256, 1024, 4, 1, d};
    prefix_gpu_parity(big, 0, false, dtype, kernel, expect, fast_bwd);
    unseen += prefix_gpu_parity(big, 320, true, dtype, kernel, expect, fast_bwd);
    EXPECT_GT(unseen, 0) << "the cases must leave prefix keys unseen";
}

TEST(GpuAttentionPrefix, WgmmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    for (int64_t d : {64, 72, 128}) prefix_cases(d, DType::bf16, AttentionKernel::wgmma, "cuda-wgmma-ordered");
    prefix_cases(64, DType::bf16, AttentionKernel::wgmma, "cuda-wgmma", false);  // the two-kernel backward
}

// Deterministic off: the fast 5-matmul backward; and fast_bwd = false, which keeps the deterministic one.
TEST(GpuAttentionPrefix, WgmmaFastBackwardParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    nondeterministic([] {
        for (int64_t d : {64, 72, 128}) prefix_cases(d, DType::bf16, AttentionKernel::wgmma, "cuda-wgmma-fast");
        prefix_cases(64, DType::bf16, AttentionKernel::wgmma, "cuda-wgmma", false);
    });
}

TEST(GpuAttentionPrefix, MmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    for (int64_t d : {64, 72, 128}) prefix_cases(d, DType::bf16, AttentionKernel::mma, "cuda-mma");
    nondeterministic([] { prefix_cases(128, DType::bf16, AttentionKernel::mma, "cuda-mma"); });
}

// Selected on a shape the tensor-core kernels would take, picked for another head dim, and f32.
TEST(GpuAttentionPrefix, GenericParity) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    prefix_cases(64, DType::bf16, AttentionKernel::generic, "cuda-generic");
    prefix_cases(36, DType::bf16, AttentionKernel::automatic, "cuda-generic");
    prefix_cases(64, DType::f32, AttentionKernel::automatic, "cuda-generic");
    nondeterministic([] { prefix_cases(32, DType::f32, AttentionKernel::automatic, "cuda-generic"); });
}

// Two runs of each deterministic family over a prefix with a window and a map give bitwise the same results (wgmma:
// its ordered 5-matmul backward and its two-kernel one).
TEST(GpuAttentionPrefix, Deterministic) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const int64_t b = 1, t = 200, tk = 700, hq = 8, hkv = 2, d = 128;
    auto gpu = [](const Tensor& x) { return x.to(DType::bf16).to_device(core::Device::cuda); };
    const Tensor q = gpu(op_randn({b, t, hq, d}, 8, 0)), k = gpu(op_randn({b, tk, hkv, d}, 8, 1));
    const Tensor v = gpu(op_randn({b, tk, hkv, d}, 8, 2)), dout = gpu(op_randn({b, t, hq, d}, 8, 3));
    const AttentionMask mask{.doc_start = prefix_doc_map(b, t, tk).to_device(core::Device::cuda), .window = 450};
    std::vector<std::pair<AttentionKernel, bool>> kernels = {{AttentionKernel::mma, true},
                                                             {AttentionKernel::generic, true}};
    if (attention_wgmma_here()) {
        kernels.push_back({AttentionKernel::wgmma, true});
        kernels.push_back({AttentionKernel::wgmma, false});
    }
    for (const auto& [kernel, fast_bwd] : kernels) {
        AttentionOptions options;
        options.kernel = kernel;
        options.fast_bwd = fast_bwd;
        std::vector<Tensor> outs;
        for (int rep = 0; rep < 2; ++rep)
            for (const Tensor& x : run_fwd_bwd(q, k, v, dout, mask, options))
                outs.push_back(x.to_device(core::Device::cpu));
        for (size_t i = 0; i < 5; ++i)
            EXPECT_EQ(std::memcmp(outs[i].raw(), outs[i + 5].raw(), outs[i].nbytes()), 0)
                << "kernel " << static_cast<int>(kernel) << (fast_bwd ? "" : " two-kernel") << " tensor " << i;
    }
}

}  // namespace
}  // namespace mt::ops::test
