// GPU parity of bidirectional attention within packed documents (AttentionMask::causal = false, the ViT's images) on
// the flash kernels (wgmma with both backwards, mma.sync; bf16, D 64, 72 and 128) against the CPU f32 reference: rows
// packed with documents of 1 to 577 tokens, GQA 4/2 and 16/16, key prefixes, and AttentionOptions::chosen naming the
// flash kernel (a fallback to generic fails). Then packed documents independent bit for bit, and two runs equal.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
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

// Document lengths of each packed row (907 tokens each); row i of a map uses order i % 3.
const std::vector<std::vector<int64_t>> kOrders = {
    {577, 1, 64, 7, 130, 65, 63}, {1, 7, 63, 64, 65, 130, 577}, {130, 65, 1, 577, 63, 7, 64}};
constexpr int64_t kPacked = 907;

// The document map of b rows over tk = 907 positions.
Tensor packed_map(int64_t b) {
    std::vector<std::vector<int64_t>> starts;
    for (int64_t row = 0; row < b; ++row) {
        std::vector<int64_t> s;
        int64_t at = 0;
        for (int64_t len : kOrders[static_cast<size_t>(row % 3)]) {
            s.push_back(at);
            at += len;
        }
        starts.push_back(s);
    }
    return mt::testing::doc_start_map(starts, kPacked);
}

using attention_gpu::expect_rho;
using attention_gpu::host64;
using attention_gpu::nan_cuda;
using attention_gpu::nondeterministic;
using attention_gpu::run_fwd_bwd;

// The key rows (of [B, Tk, Hkv, D]) that no query sees, those of documents that end before the first query (position
// Tk - T), are exact zeros. Found from the map, not from zeros of the reference: a one-token document's dk is zero
// only up to rounding, and may come out exactly zero on one side alone. Returns how many key positions are unseen.
int expect_unseen_zero(const std::string& name, const char* what, const Tensor& got, const Tensor& map, int64_t t) {
    if (!map.defined()) return 0;
    const Tensor g = host64(got);
    const int64_t b = got.size(0), tk = got.size(1), hkv = got.size(2), d = got.size(3), off = tk - t;
    int unseen = 0;
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t s = 0; s < tk; ++s) {
            // Seen: a query's own position, or a prefix key of the document that holds the first query.
            if (s >= off || core::tensor_get_flat(map, bb * tk + s) == core::tensor_get_flat(map, bb * tk + off))
                continue;
            ++unseen;
            for (int64_t c = 0; c < hkv * d; ++c)
                EXPECT_EQ(core::tensor_get_flat(g, (bb * tk + s) * hkv * d + c), 0.0)
                    << name << " " << what << " row " << bb << " key " << s;
        }
    return unseen;
}

// The CUDA forward and backward (bf16 inputs) against the CPU f32 reference; the forward must report expect_fwd and
// the backward expect_bwd. Returns the number of key rows no query sees (exact zeros in dk).
int bidir_gpu_parity(const Shape4& s,
                     bool docs,
                     AttentionKernel kernel,
                     const char* expect_fwd,
                     const char* expect_bwd,
                     bool fast_bwd = true) {
    const std::string name = fmt::format("bidir_b{}_t{}_tk{}_hq{}_hkv{}_d{}{}_{}{}",
                                         s.b,
                                         s.t,
                                         s.tk,
                                         s.hq,
                                         s.hkv,
                                         s.d,
                                         docs ? "_docs" : "",
                                         expect_bwd,
                                         core::exec().deterministic ? "" : "_nondeterministic");
    const uint64_t seed = op_seed(name);
    auto rounded = [&](const Tensor& x) { return x.to(DType::bf16).to(DType::f32); };
    auto gpu = [&](const Tensor& x) { return x.to(DType::bf16).to_device(core::Device::cuda); };
    const Tensor q = rounded(op_randn({s.b, s.t, s.hq, s.d}, seed, 0));
    const Tensor k = rounded(op_randn({s.b, s.tk, s.hkv, s.d}, seed, 1));
    const Tensor v = rounded(op_randn({s.b, s.tk, s.hkv, s.d}, seed, 2));
    const Tensor dout = rounded(op_randn({s.b, s.t, s.hq, s.d}, seed, 3));
    const Tensor map = docs ? packed_map(s.b) : Tensor();
    const std::vector<Tensor> ref = run_fwd_bwd(q, k, v, dout, {.doc_start = map, .causal = false}, {});
    std::string fwd_chosen, bwd_chosen;
    AttentionOptions options;
    options.kernel = kernel;
    options.fast_bwd = fast_bwd;
    options.chosen = &bwd_chosen;
    const AttentionMask gpu_mask{.doc_start = docs ? map.to_device(core::Device::cuda) : Tensor(), .causal = false};
    const std::vector<Tensor> got = run_fwd_bwd(gpu(q), gpu(k), gpu(v), gpu(dout), gpu_mask, options, &fwd_chosen);
    EXPECT_EQ(fwd_chosen, expect_fwd) << name;
    EXPECT_EQ(bwd_chosen, expect_bwd) << name;
    const double budget = 1e-2;  // the bf16 flash budget of the causal cases
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (size_t i = 0; i < ref.size(); ++i) expect_rho(name, names[i], got[i], ref[i], budget);
    const int unseen = expect_unseen_zero(name, "dk", got[3], map, s.t);
    expect_unseen_zero(name, "dv", got[4], map, s.t);
    return unseen;
}

// The cases every flash family runs at head dim d: three packed rows (GQA 4/2), two packed rows of 16/16 heads, one
// document per row with T off every tile (300), and key prefixes (the last 400 of the 907 positions as queries: row 0's
// first document spans the prefix and the queries, rows 1 and 2 have documents wholly in the prefix; and 100 queries
// over 300 keys without a map).
void bidir_cases(
    int64_t d, AttentionKernel kernel, const char* expect_fwd, const char* expect_bwd, bool fast_bwd = true) {
    bidir_gpu_parity({3, kPacked, kPacked, 4, 2, d}, true, kernel, expect_fwd, expect_bwd, fast_bwd);
    bidir_gpu_parity({2, kPacked, kPacked, 16, 16, d}, true, kernel, expect_fwd, expect_bwd, fast_bwd);
    bidir_gpu_parity({2, 300, 300, 4, 2, d}, false, kernel, expect_fwd, expect_bwd, fast_bwd);
    const int unseen = bidir_gpu_parity({3, 400, kPacked, 4, 2, d}, true, kernel, expect_fwd, expect_bwd, fast_bwd);
    EXPECT_GT(unseen, 0) << "the prefix case must leave keys unseen";
    bidir_gpu_parity({1, 100, 300, 4, 2, d}, false, kernel, expect_fwd, expect_bwd, fast_bwd);
}

TEST(GpuAttentionBidirectional, WgmmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    for (int64_t d : {64, 72, 128}) bidir_cases(d, AttentionKernel::wgmma, "cuda-wgmma", "cuda-wgmma-ordered");
    bidir_cases(64, AttentionKernel::wgmma, "cuda-wgmma", "cuda-wgmma", false);  // the two-kernel backward
}

// Deterministic off: the fast 5-matmul backward; and fast_bwd = false, which keeps the deterministic one.
TEST(GpuAttentionBidirectional, WgmmaFastBackwardParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    nondeterministic([] {
        for (int64_t d : {64, 72, 128}) bidir_cases(d, AttentionKernel::wgmma, "cuda-wgmma", "cuda-wgmma-fast");
        bidir_cases(64, AttentionKernel::wgmma, "cuda-wgmma", "cuda-wgmma", false);
    });
}

TEST(GpuAttentionBidirectional, MmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    for (int64_t d : {64, 72, 128}) bidir_cases(d, AttentionKernel::mma, "cuda-mma", "cuda-mma");
}

// The automatic choice takes the flash kernels for bidirectional bf16 at head dims that are multiples of 8 up to 128
// (64; the tiny ViT's 16 and the reference ViT's 72 on zero-padded tiles); AttentionKernel::generic still forces the
// generic ones, and other head dims (20) keep them.
TEST(GpuAttentionBidirectional, DispatchBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const char* flash = attention_wgmma_here() ? "cuda-wgmma" : "cuda-mma";
    const char* flash_bwd = attention_wgmma_here() ? "cuda-wgmma-ordered" : "cuda-mma";
    bidir_gpu_parity({3, kPacked, kPacked, 4, 2, 64}, true, AttentionKernel::automatic, flash, flash_bwd);
    bidir_gpu_parity({3, kPacked, kPacked, 4, 2, 64}, true, AttentionKernel::generic, "cuda-generic", "cuda-generic");
    bidir_gpu_parity({2, 300, 300, 4, 2, 16}, false, AttentionKernel::automatic, flash, flash_bwd);
    bidir_gpu_parity({3, kPacked, kPacked, 4, 2, 72}, true, AttentionKernel::automatic, flash, flash_bwd);
    bidir_gpu_parity({2, 300, 300, 4, 2, 20}, false, AttentionKernel::automatic, "cuda-generic", "cuda-generic");
}

// On each deterministic flash backward (mma.sync; wgmma's ordered 5-matmul one and its two-kernel one): perturbing
// document [578, 642) of row 0 (64 tokens) and document [330, 907) of row 1 (577) in q, k, v and dout leaves every
// other document's out, lse, dq, dk and dv bitwise unchanged; and two runs of the same inputs are bitwise equal.
TEST(GpuAttentionBidirectional, PackedDocumentsBitwiseIndependent) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const int64_t b = 2, t = kPacked, hq = 4, hkv = 2;
    struct Span {
        int64_t row, first, end;
    };
    const Span moved[] = {{0, 578, 642}, {1, 330, kPacked}};
    const Span kept[] = {{0, 0, 578}, {0, 642, kPacked}, {1, 0, 330}};
    struct Variant {
        AttentionKernel kernel;
        bool fast_bwd;
        const char* expect;
    };
    std::vector<Variant> variants = {{AttentionKernel::mma, true, "cuda-mma"}};
    if (attention_wgmma_here()) {
        variants.push_back({AttentionKernel::wgmma, true, "cuda-wgmma-ordered"});
        variants.push_back({AttentionKernel::wgmma, false, "cuda-wgmma"});
    }
    for (int64_t d : {64, 128})
        for (const Variant& variant : variants) {
            const AttentionKernel kernel = variant.kernel;
            const std::string name = fmt::format("d{} {}", d, variant.expect);
            const Tensor q = op_randn({b, t, hq, d}, 9, 0), k = op_randn({b, t, hkv, d}, 9, 1);
            const Tensor v = op_randn({b, t, hkv, d}, 9, 2), dout = op_randn({b, t, hq, d}, 9, 3);
            std::vector<Tensor> perturbed;
            for (const Tensor& x : {q, k, v, dout}) {
                Tensor y = x.clone();
                for (const Span& s : moved) {
                    const Tensor doc = y.select(0, s.row).slice(0, s.first, s.end);
                    doc.copy_from(op_randn(doc.shape(), 10, static_cast<uint64_t>(s.row)));
                }
                perturbed.push_back(y);
            }
            auto gpu = [](const Tensor& x) { return x.to(DType::bf16).to_device(core::Device::cuda); };
            const AttentionMask mask{.doc_start = packed_map(b).to_device(core::Device::cuda), .causal = false};
            AttentionOptions options;
            options.kernel = kernel;
            options.fast_bwd = variant.fast_bwd;
            auto host = [](std::vector<Tensor> xs) {
                for (Tensor& x : xs) x = x.to_device(core::Device::cpu);
                return xs;
            };
            const std::vector<Tensor> base = host(run_fwd_bwd(gpu(q), gpu(k), gpu(v), gpu(dout), mask, options));
            std::string chosen;
            options.chosen = &chosen;
            const std::vector<Tensor> again = host(run_fwd_bwd(gpu(q), gpu(k), gpu(v), gpu(dout), mask, options));
            options.chosen = nullptr;
            const std::vector<Tensor> other = host(
                run_fwd_bwd(gpu(perturbed[0]), gpu(perturbed[1]), gpu(perturbed[2]), gpu(perturbed[3]), mask, options));
            EXPECT_EQ(chosen, variant.expect) << name;
            const char* names[] = {"out", "lse", "dq", "dk", "dv"};
            for (size_t i = 0; i < 5; ++i) {
                EXPECT_EQ(std::memcmp(base[i].raw(), again[i].raw(), base[i].nbytes()), 0)
                    << name << " " << names[i] << ": two runs differ";
                for (const Span& s : kept) {
                    // lse is [B, Hq, T]: the span runs along its last dim; the others are [B, T, H, D].
                    const Tensor x = i == 1 ? base[i].select(0, s.row).slice(1, s.first, s.end).clone()
                                            : base[i].select(0, s.row).slice(0, s.first, s.end).clone();
                    const Tensor y = i == 1 ? other[i].select(0, s.row).slice(1, s.first, s.end).clone()
                                            : other[i].select(0, s.row).slice(0, s.first, s.end).clone();
                    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0)
                        << name << " " << names[i] << " row " << s.row << " [" << s.first << ", " << s.end << ")";
                }
            }
        }
}

}  // namespace
}  // namespace mt::ops::test
