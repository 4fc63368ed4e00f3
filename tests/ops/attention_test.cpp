// Cases and argument checks of causal GQA attention (ops/attention.h): T = 1, prime T, T across the 64-row query
// blocks, Hq != Hkv. Direct GPU parity checks of the CUDA path: the tensor-core flash kernels (bf16, D 64 and 128;
// the wgmma backward also in its experimental non-deterministic form) and the simple kernels (other D, and f32) against
// the CPU f32 reference on the same rounded inputs, and bitwise run-to-run determinism of the backward. The GPU tests
// skip where no GPU is present.
#include "ops/attention.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>

#include "core/backend.h"
#include "op_harness.h"
#include "ops/op_common.h"
#include "support/documents.h"

namespace mt::ops::test {
namespace {

// lse [B, Hq, T]: the dtype of q on the CPU, f32 on the GPU (where q may be bf16).
Tensor lse_like(const Tensor& q, int64_t b, int64_t hq, int64_t t) {
    const bool cuda = q.device() == core::Device::cuda;
    return Tensor::zeros({b, hq, t}, cuda ? DType::f32 : q.dtype(), q.device());
}

OpCase attention_case(int64_t b, int64_t t, int64_t hq, int64_t hkv, int64_t d) {
    const std::string name = fmt::format("attention_b{}_t{}_hq{}_hkv{}_d{}", b, t, hq, hkv, d);
    OpCase c{"attention", name, [=] {
                 const uint64_t s = op_seed(name);
                 OpProblem p;
                 p.inputs = {{"q", op_randn({b, t, hq, d}, s, 0), GradKind::written},
                             {"k", op_randn({b, t, hkv, d}, s, 1), GradKind::written},
                             {"v", op_randn({b, t, hkv, d}, s, 2), GradKind::written}};
                 p.forward = [=](const std::vector<Tensor>& in) {
                     Tensor out = op_like(in[0]), lse = lse_like(in[0], b, hq, t);
                     attention_fwd(in[0], in[1], in[2], out, lse);
                     return std::vector<Tensor>{out};
                 };
                 p.backward = [=](const std::vector<Tensor>& in,
                                  const std::vector<Tensor>& dout,
                                  const std::vector<Tensor>& grads) {
                     Tensor out = op_like(in[0]), lse = lse_like(in[0], b, hq, t);
                     attention_fwd(in[0], in[1], in[2], out, lse);
                     attention_bwd(in[0], in[1], in[2], out, lse, dout[0], grads[0], grads[1], grads[2]);
                 };
                 return p;
             }};
    if (t == 1) {
        // With one position the softmax is constant, so the exact dq and dk are zero and both sides hold only
        // rounding noise: judge them on an absolute scale.
        c.parity.rms_floor = 1e-3;
        c.parity.floor_tensors = {"dq", "dk"};
        // In f32 that noise is about 1e-7 * the O(1) terms dP and delta whose difference is zero (5e-8 rms seen on
        // an H200), i.e. rho 5e-5 against the 1e-3 floor.
        c.parity.f32_budget = 1e-4;
        c.parity.budget_reason = "T = 1: dq and dk are exactly zero";
        c.f32_rms_floor = 0.1;
        c.f32_floor_reason = "T = 1: dq and dk are exactly zero (f32 returns rounding noise, 5e-2 of its own rms)";
    }
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(attention_case(1, 1, 1, 1, 1));
    op_register(attention_case(2, 1, 2, 2, 4));   // T = 1
    op_register(attention_case(2, 5, 2, 1, 3));   // GQA, groups of 2
    op_register(attention_case(1, 13, 3, 3, 5));  // T prime
    op_register(attention_case(1, 7, 6, 2, 8));   // GQA, groups of 3
    op_register(attention_case(1, 67, 4, 2, 4));  // T across two query blocks
    op_register(attention_case(2, 131, 2, 1, 6));
    return true;
}();

// Output and lse against the definition written out directly (naive loops) on a GQA case.
TEST(OpAttention, MatchesNaiveDefinition) {
    const int64_t b = 2, t = 70, hq = 4, hkv = 2, d = 3;
    const Tensor q = op_randn({b, t, hq, d}, 9, 0), k = op_randn({b, t, hkv, d}, 9, 1),
                 v = op_randn({b, t, hkv, d}, 9, 2);
    const Tensor out = op_like(q), lse = op_like(q, {b, hq, t});
    attention_fwd(q, k, v, out, lse);
    double worst = 0;
    for (int64_t bb = 0; bb < b; ++bb) {
        for (int64_t h = 0; h < hq; ++h) {
            const int64_t kh = h / (hq / hkv);
            for (int64_t i = 0; i < t; ++i) {
                std::vector<double> s(static_cast<size_t>(i + 1));
                double mx = -1e300, sum = 0;
                for (int64_t j = 0; j <= i; ++j) {
                    double dot = 0;
                    for (int64_t c = 0; c < d; ++c) dot += q.at({bb, i, h, c}) * k.at({bb, j, kh, c});
                    s[j] = dot / std::sqrt(static_cast<double>(d));
                    mx = std::max(mx, s[j]);
                }
                for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
                worst = std::max(worst, std::fabs(lse.at({bb, h, i}) - (mx + std::log(sum))));
                for (int64_t c = 0; c < d; ++c) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; ++j) o += std::exp(s[j] - mx) / sum * v.at({bb, j, kh, c});
                    worst = std::max(worst, std::fabs(out.at({bb, i, h, c}) - o));
                }
            }
        }
    }
    EXPECT_LT(worst, 1e-12);
}

TEST(OpArgs, AttentionShapesAndDtypes) {
    const Tensor q = Tensor::zeros({2, 3, 4, 5}, DType::f32), k = Tensor::zeros({2, 3, 2, 5}, DType::f32);
    const Tensor v = op_like(k), out = op_like(q), lse = Tensor::zeros({2, 4, 3}, DType::f32);
    attention_fwd(q, k, v, out, lse);
    expect_op_error(
        [&] {
            attention_fwd(
                q, Tensor::zeros({2, 3, 3, 5}, DType::f32), Tensor::zeros({2, 3, 3, 5}, DType::f32), out, lse);
        },
        "attention_fwd: q has 4 heads and k has 3; Hq must be a multiple of Hkv");
    expect_op_error(
        [&] {
            attention_fwd(q, k, Tensor::zeros({2, 3, 2, 4}, DType::f32), out, lse);
        },
        "attention_fwd: v has shape [2, 3, 2, 4], expected [2, 3, 2, 5]");
    expect_op_error(
        [&] {
            attention_fwd(q, Tensor::zeros({2, 2, 2, 5}, DType::f32), v, out, lse);
        },
        "attention_fwd: k has 2 positions, fewer than the 3 queries of q");
    expect_op_error(
        [&] {
            attention_fwd(q, Tensor::zeros({2, 4, 2, 5}, DType::f32), v, out, lse);
        },
        "attention_fwd: v has shape [2, 3, 2, 5], expected [2, 4, 2, 5]");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, out, Tensor::zeros({2, 3, 4}, DType::f32));
        },
        "attention_fwd: lse has shape [2, 3, 4], expected [2, 4, 3]");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, Tensor::zeros({2, 3, 4, 4}, DType::f32), lse);
        },
        "attention_fwd: out has shape [2, 3, 4, 4], expected [2, 3, 4, 5]");
    expect_op_error([&] { attention_fwd(q, k.to(DType::f64), v, out, lse); },
                    "attention_fwd: k has dtype f64, expected f32 (the dtype of q)");
    expect_op_error([&] { attention_fwd(q.to(DType::bf16), k, v, out, lse); }, "attention_fwd: q has dtype bf16");
    expect_op_error(
        [&] {
            attention_fwd(op_noncontiguous({2, 3, 4, 5}, DType::f32), k, v, out, lse);
        },
        "attention_fwd: q must be contiguous");
    expect_op_error(
        [&] {
            attention_fwd(q, k, v, out, op_cuda_view({2, 4, 3}, DType::f32));
        },
        "attention_fwd: lse is on cuda but q is on cpu; all tensors of one call must be on the same device");

    const Tensor dq = op_like(q), dk = op_like(k), dv = op_like(v);
    attention_bwd(q, k, v, out, lse, out, dq, dk, dv);
    expect_op_error([&] { attention_bwd(q, k, v, out, lse, out, dq, dk, op_like(q)); },
                    "attention_bwd: dv has shape [2, 3, 4, 5], expected [2, 3, 2, 5]");
    expect_op_error([&] { attention_bwd(q, k, v, out, lse, out.to(DType::f64), dq, dk, dv); },
                    "attention_bwd: dout has dtype f64, expected f32 (the dtype of q)");
    expect_op_error(
        [&] {
            attention_bwd(q, k, v, out, lse, out, op_noncontiguous({2, 3, 4, 5}, DType::f32), dk, dv);
        },
        "attention_bwd: dq must be contiguous");
}

// CUDA tensors go to the CUDA path; without a GPU that is one clear device error.
TEST(OpArgs, AttentionCudaDispatch) {
    const Tensor q = op_cuda_view({2, 3, 4, 5}, DType::f32), k = op_cuda_view({2, 3, 2, 5}, DType::f32);
    const Tensor lse = op_cuda_view({2, 4, 3}, DType::f32);
    expect_op_error(
        [&] {
            attention_fwd(q, k, op_cuda_view({2, 3, 2, 4}, DType::f32), q, lse);
        },
        "attention_fwd: v has shape [2, 3, 2, 4], expected [2, 3, 2, 5]");
    expect_op_error([&] { attention_bwd(q, k, k, q, lse, q, q, k, q); },
                    "attention_bwd: dv has shape [2, 3, 4, 5], expected [2, 3, 2, 5]");
    if (core::backend_available(core::Device::cuda)) return;
    expect_op_error([&] { attention_fwd(q, k, k, q, lse); },
                    "attention_fwd: got cuda tensors, but no CUDA device is available",
                    core::ExitCode::device);
}

Tensor to_cuda(const Tensor& t, DType dtype) {
    return t.to(dtype).to_device(core::Device::cuda);
}
Tensor to_host(const Tensor& t) {
    return t.to_device(core::Device::cpu).to(DType::f64);
}
Tensor nan_cuda(const Shape& shape, DType dtype) {
    const Tensor t = Tensor::zeros(shape, dtype, core::Device::cuda);
    t.fill(std::nan(""));
    return t;
}

// rho, except that a reference whose rms is below 1e-3 is judged against 1e-3 rms: with T = 1 the exact dq and dk
// are 0 (one key: dS = dP - delta = 0), and what the GPU returns there is fp32 rounding of dP - delta.
double attention_rho(const Tensor& got, const Tensor& ref) {
    const Tensor g = to_host(got), r = to_host(ref);
    if (r.numel() == 0) return 0.0;
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
        const double a = core::tensor_get_flat(g, i), b = core::tensor_get_flat(r, i);
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    const double floor = 1e-6 * static_cast<double>(r.numel());  // (1e-3 rms)^2 * n
    return std::sqrt(diff / std::max(norm, floor));              // NaN stays NaN
}

void expect_rho(const std::string& name, const char* what, const Tensor& got, const Tensor& ref, double budget) {
    const double rho = attention_rho(got, ref);
    std::printf("[ GPU PARITY ] %s %s: rho %.3e (budget %.0e)\n", name.c_str(), what, rho, budget);
    EXPECT_LE(rho, budget) << name << " " << what;  // NaN fails too
}

// Whether this GPU runs the wgmma kernels (Hopper): what the automatic choice reports for a small bf16 call.
bool flash_wgmma_available() {
    if (!core::backend_available(core::Device::cuda)) return false;
    const Tensor q = to_cuda(op_randn({1, 16, 1, 64}, 9, 0), DType::bf16);
    const Tensor out = nan_cuda(q.shape(), DType::bf16), lse = nan_cuda({1, 1, 16}, DType::f32);
    std::string chosen;
    AttentionOptions options;
    options.chosen = &chosen;
    attention_fwd(q, q, q, out, lse, options);
    return chosen == "cuda-wgmma";
}

const char* family_name(AttentionKernel kernel) {
    switch (kernel) {
        case AttentionKernel::automatic:
            return "";
        case AttentionKernel::wgmma:
            return "wgmma";
        case AttentionKernel::mma:
            return "mma";
        case AttentionKernel::generic:
            return "generic";
    }
    return "?";
}

// The CUDA attention forward and backward with inputs of `dtype` against the CPU f32 reference on the same rounded
// inputs; every output starts as NaN (each element must be written). `options` selects the kernels; where
// `expect_bwd` is given, the backward must report running that one (AttentionOptions::chosen), so that a selection
// that stopped working fails instead of testing the default twice.
void attention_gpu_parity(int64_t b,
                          int64_t t,
                          int64_t hq,
                          int64_t hkv,
                          int64_t d,
                          DType dtype,
                          double budget,
                          AttentionOptions options = {},
                          const char* expect_bwd = nullptr) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const char* kernel = family_name(options.kernel);
    const std::string name = fmt::format("attention_gpu_b{}_t{}_hq{}_hkv{}_d{}_{}{}{}{}",
                                         b,
                                         t,
                                         hq,
                                         hkv,
                                         d,
                                         core::dtype_name(dtype),
                                         *kernel != 0 ? "_" : "",
                                         kernel,
                                         core::exec().deterministic ? "" : "_nondeterministic");
    const uint64_t s = op_seed(name);
    auto rounded = [&](const Tensor& x) { return x.to(dtype).to(DType::f32); };
    const Tensor q = rounded(op_randn({b, t, hq, d}, s, 0)), k = rounded(op_randn({b, t, hkv, d}, s, 1));
    const Tensor v = rounded(op_randn({b, t, hkv, d}, s, 2)), dout = rounded(op_randn({b, t, hq, d}, s, 3));
    const Tensor out_ref = op_like(q), lse_ref = Tensor::zeros({b, hq, t}, DType::f32);
    const Tensor dq_ref = op_like(q), dk_ref = op_like(k), dv_ref = op_like(v);
    attention_fwd(q, k, v, out_ref, lse_ref);
    attention_bwd(q, k, v, out_ref, lse_ref, dout, dq_ref, dk_ref, dv_ref);

    const Tensor qg = to_cuda(q, dtype), kg = to_cuda(k, dtype), vg = to_cuda(v, dtype), dog = to_cuda(dout, dtype);
    const Tensor out = nan_cuda(q.shape(), dtype), lse = nan_cuda({b, hq, t}, DType::f32);
    const Tensor dq = nan_cuda(q.shape(), dtype), dk = nan_cuda(k.shape(), dtype), dv = nan_cuda(k.shape(), dtype);
    std::string chosen;
    options.chosen = &chosen;
    attention_fwd(qg, kg, vg, out, lse, options);
    attention_bwd(qg, kg, vg, out, lse, dog, dq, dk, dv, options);
    if (expect_bwd != nullptr) {
        EXPECT_EQ(chosen, expect_bwd) << name;
    }
    expect_rho(name, "out", out, out_ref, budget);
    expect_rho(name, "lse", lse, lse_ref, budget);
    expect_rho(name, "dq", dq, dq_ref, budget);
    expect_rho(name, "dk", dk, dk_ref, budget);
    expect_rho(name, "dv", dv, dv_ref, budget);
}

// The tensor-core kernels: D 64 and 128, T = 1, T across and on the 64- and 128-row blocks, GQA groups of 1 to 4;
// and head dims below the tile width (8, 32 on tiles of 64; 72, the reference ViT's, 96 and 120 on tiles of 128).
void flash_parity_cases(AttentionOptions options = {}, const char* expect_bwd = nullptr) {
    attention_gpu_parity(1, 1, 1, 1, 64, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(2, 67, 4, 2, 8, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 130, 2, 1, 32, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(2, 200, 4, 2, 72, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 131, 2, 2, 96, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 70, 3, 1, 120, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(2, 67, 4, 2, 64, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 130, 2, 1, 64, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(2, 128, 2, 2, 128, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 200, 6, 2, 128, DType::bf16, 1e-2, options, expect_bwd);
    attention_gpu_parity(1, 523, 4, 1, 128, DType::bf16, 1e-2, options, expect_bwd);
}

// The default kernel of this GPU (wgmma on Hopper; its deterministic backward, the default context being so: the
// 5-matmul one with its dq sums in a fixed order), and wgmma's two-kernel deterministic backward.
TEST(GpuAttention, FlashParityBf16) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    flash_parity_cases({}, flash_wgmma_available() ? "cuda-wgmma-ordered" : "cuda-mma");
    if (!flash_wgmma_available()) return;
    AttentionOptions two_kernel;
    two_kernel.fast_bwd = false;
    flash_parity_cases(two_kernel, "cuda-wgmma");
}

// Runs fn under a context with deterministic off (core::ExecScope), which selects the 5-matmul wgmma backward that
// sums dq with float reductions; the previous context comes back after.
void with_fast_bwd(const std::function<void()>& fn) {
    core::ExecCtx ctx = core::exec();
    ctx.deterministic = false;
    const core::ExecScope scope(ctx);
    fn();
}

// The fast (non-deterministic) wgmma backward: the same cases, and more key blocks of 128 per GQA group; and
// AttentionOptions::fast_bwd = false, which keeps the deterministic wgmma backward in such a context.
TEST(GpuAttention, FlashFastParityBf16) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!flash_wgmma_available()) GTEST_SKIP() << "the fast backward is a wgmma kernel (Hopper)";
    with_fast_bwd([] {
        flash_parity_cases({}, "cuda-wgmma-fast");
        attention_gpu_parity(2, 300, 8, 2, 64, DType::bf16, 1e-2, {}, "cuda-wgmma-fast");
        attention_gpu_parity(1, 1000, 4, 2, 128, DType::bf16, 1e-2, {}, "cuda-wgmma-fast");
        AttentionOptions deterministic_bwd;
        deterministic_bwd.fast_bwd = false;
        attention_gpu_parity(2, 300, 8, 2, 64, DType::bf16, 1e-2, deterministic_bwd, "cuda-wgmma");
    });
}

AttentionOptions kernel_family(AttentionKernel kernel) {
    AttentionOptions options;
    options.kernel = kernel;
    return options;
}

// The mma.sync kernels (the path of GPUs before Hopper).
TEST(GpuAttention, FlashMmaParityBf16) {
    flash_parity_cases(kernel_family(AttentionKernel::mma), "cuda-mma");
}

// The generic kernels on shapes the tensor-core ones would take, selected by the option.
TEST(GpuAttention, GenericSelectedParityBf16) {
    attention_gpu_parity(2, 67, 4, 2, 64, DType::bf16, 1e-2, kernel_family(AttentionKernel::generic), "cuda-generic");
    attention_gpu_parity(1, 200, 6, 2, 128, DType::bf16, 1e-2, kernel_family(AttentionKernel::generic), "cuda-generic");
}

// The simple kernels: head dims the tensor-core ones do not take (not a multiple of 8, or above 128) in bf16, and f32.
TEST(GpuAttention, GenericParity) {
    attention_gpu_parity(1, 5, 3, 3, 5, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(2, 13, 2, 1, 12, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(1, 70, 4, 2, 36, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(1, 50, 2, 1, 100, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(1, 33, 2, 2, 136, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(1, 33, 2, 2, 256, DType::bf16, 1e-2, {}, "cuda-generic");
    attention_gpu_parity(1, 33, 3, 1, 5, DType::f32, 1e-5);
    attention_gpu_parity(2, 67, 4, 2, 64, DType::f32, 1e-5);
    attention_gpu_parity(1, 40, 2, 2, 128, DType::f32, 1e-5);
}

// Two runs give bitwise the same outputs and gradients (no atomics, or float reductions in a fixed order; GQA sums in
// a fixed order).
// `expect` names the backward that must run.
void expect_deterministic(const char* expect, AttentionOptions options = {}, int64_t t = 300) {
    const int64_t b = 2, hq = 8, hkv = 2, d = 128;
    const Tensor q = to_cuda(op_randn({b, t, hq, d}, 5, 0), DType::bf16);
    const Tensor k = to_cuda(op_randn({b, t, hkv, d}, 5, 1), DType::bf16);
    const Tensor v = to_cuda(op_randn({b, t, hkv, d}, 5, 2), DType::bf16);
    const Tensor dout = to_cuda(op_randn({b, t, hq, d}, 5, 3), DType::bf16);
    std::vector<Tensor> outs;
    std::string chosen;
    options.chosen = &chosen;
    for (int run = 0; run < 2; ++run) {
        const Tensor out = nan_cuda(q.shape(), DType::bf16), lse = nan_cuda({b, hq, t}, DType::f32);
        const Tensor dq = nan_cuda(q.shape(), DType::bf16), dk = nan_cuda(k.shape(), DType::bf16);
        const Tensor dv = nan_cuda(k.shape(), DType::bf16);
        attention_fwd(q, k, v, out, lse, options);
        attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, options);
        for (const Tensor& x : {out, lse, dq, dk, dv}) outs.push_back(x.to_device(core::Device::cpu));
        EXPECT_EQ(chosen, expect) << "t " << t;
    }
    for (size_t i = 0; i < 5; ++i)
        EXPECT_EQ(std::memcmp(outs[i].raw(), outs[i + 5].raw(), outs[i].nbytes()), 0) << "tensor " << i;
}

TEST(GpuAttention, Deterministic) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const bool wgmma = flash_wgmma_available();
    expect_deterministic(wgmma ? "cuda-wgmma-ordered" : "cuda-mma");
    expect_deterministic(wgmma ? "cuda-wgmma-ordered" : "cuda-mma", {}, 2048);  // 16 key blocks add to a late dq block
    expect_deterministic("cuda-mma", kernel_family(AttentionKernel::mma));
    if (!wgmma) return;
    AttentionOptions two_kernel;
    two_kernel.fast_bwd = false;
    expect_deterministic("cuda-wgmma", two_kernel);
}

// The ordered 5-matmul backward when a (batch, head) has more key blocks of 128 than the GPU runs thread blocks at
// once (20,000 keys: 157 blocks, an H100 or H200 runs 132): a block waits only on blocks started before it, so this
// ends (a wrong order would hang here); twice bitwise the same, and against the two-kernel backward. Causal without
// a mask, with a window (the key blocks that see a query block start after key block 0) and with documents off the
// tiles; bidirectional within the same documents (a query block's last key block found through the document's end).
TEST(GpuAttention, OrderedBackwardPastOneWave) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!flash_wgmma_available()) GTEST_SKIP() << "the ordered backward is a wgmma kernel (Hopper)";
    const int64_t b = 1, t = 20000, hq = 4, hkv = 2, d = 64;
    const Tensor q = to_cuda(op_randn({b, t, hq, d}, 6, 0), DType::bf16);
    const Tensor k = to_cuda(op_randn({b, t, hkv, d}, 6, 1), DType::bf16);
    const Tensor v = to_cuda(op_randn({b, t, hkv, d}, 6, 2), DType::bf16);
    const Tensor dout = to_cuda(op_randn({b, t, hq, d}, 6, 3), DType::bf16);
    const Tensor docs =
        mt::testing::doc_start_map({{0, 2900, 6100, 13000, 13001, 19990}}, t).to_device(core::Device::cuda);
    const std::pair<const char*, AttentionMask> cases[] = {{"causal", {}},
                                                           {"window", {.window = 3000}},
                                                           {"documents", {.doc_start = docs}},
                                                           {"bidirectional", {.doc_start = docs, .causal = false}}};
    for (const auto& [what, mask] : cases) {
        auto grads = [&](bool fast_bwd) {
            std::string chosen;
            AttentionOptions options;
            options.fast_bwd = fast_bwd;
            options.chosen = &chosen;
            const Tensor out = nan_cuda(q.shape(), DType::bf16), lse = nan_cuda({b, hq, t}, DType::f32);
            const Tensor dq = nan_cuda(q.shape(), DType::bf16), dk = nan_cuda(k.shape(), DType::bf16);
            const Tensor dv = nan_cuda(k.shape(), DType::bf16);
            attention_fwd(q, k, v, out, lse, options, mask);
            attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, options, mask);
            EXPECT_EQ(chosen, fast_bwd ? "cuda-wgmma-ordered" : "cuda-wgmma") << what;
            return std::vector<Tensor>{dq.to_device(core::Device::cpu).to(DType::f32),
                                       dk.to_device(core::Device::cpu).to(DType::f32),
                                       dv.to_device(core::Device::cpu).to(DType::f32)};
        };
        const std::vector<Tensor> first = grads(true), again = grads(true), two_kernel = grads(false);
        const char* names[] = {"dq", "dk", "dv"};
        for (size_t i = 0; i < 3; ++i) {
            EXPECT_EQ(std::memcmp(first[i].raw(), again[i].raw(), first[i].nbytes()), 0)
                << names[i] << " " << what << ": two runs differ";
            expect_rho(fmt::format("ordered_past_one_wave_{}", what), names[i], first[i], two_kernel[i], 1e-2);
        }
    }
}

// A q that is not 16-byte aligned (a view at an odd element offset) takes the simple kernels, with the same result.
TEST(GpuAttention, MisalignedViewFallsBack) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const int64_t b = 1, t = 70, hq = 2, hkv = 1, d = 64;
    const Tensor qh = op_randn({b, t, hq, d}, 3, 0);
    const Tensor k = to_cuda(op_randn({b, t, hkv, d}, 3, 1), DType::bf16);
    const Tensor v = to_cuda(op_randn({b, t, hkv, d}, 3, 2), DType::bf16);
    const Tensor q = to_cuda(qh, DType::bf16);
    const Tensor big = Tensor::zeros({q.numel() + 8}, DType::bf16, core::Device::cuda);
    const Tensor q_odd = Tensor::view_of(big.storage(), 2, q.shape(), DType::bf16);  // 2 bytes past a 16-byte line
    q_odd.copy_from(q);
    const Tensor out = nan_cuda(q.shape(), DType::bf16), out_odd = nan_cuda(q.shape(), DType::bf16);
    const Tensor lse = nan_cuda({b, hq, t}, DType::f32), lse_odd = nan_cuda({b, hq, t}, DType::f32);
    std::string chosen;
    AttentionOptions options;
    options.chosen = &chosen;
    attention_fwd(q, k, v, out, lse);
    attention_fwd(q_odd, k, v, out_odd, lse_odd, options);
    EXPECT_EQ(chosen, "cuda-generic");
    EXPECT_LE(op_rho(to_host(out_odd), to_host(out)), 1e-2);
    EXPECT_LE(op_rho(to_host(lse_odd), to_host(lse)), 1e-5);
}

// The CUDA path's dtype rules: q, k, v and the gradients bf16 or f32; lse f32.
TEST(GpuAttention, DtypeErrors) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const auto cuda = core::Device::cuda;
    const Tensor q = Tensor::zeros({1, 3, 2, 8}, DType::bf16, cuda), k = Tensor::zeros({1, 3, 1, 8}, DType::bf16, cuda);
    const Tensor lse = Tensor::zeros({1, 2, 3}, DType::f32, cuda);
    expect_op_error(
        [&] {
            attention_fwd(q, k, k, q, Tensor::zeros({1, 2, 3}, DType::bf16, cuda));
        },
        "attention_fwd: lse has dtype bf16, expected f32");
    expect_op_error([&] { attention_fwd(q, k.to(DType::f32), k, q, lse); },
                    "attention_fwd: k and v must have the dtype of q (bf16)");
    expect_op_error(
        [&] {
            attention_fwd(Tensor::zeros({1, 3, 2, 300}, DType::bf16, cuda),
                          Tensor::zeros({1, 3, 1, 300}, DType::bf16, cuda),
                          Tensor::zeros({1, 3, 1, 300}, DType::bf16, cuda),
                          Tensor::zeros({1, 3, 2, 300}, DType::bf16, cuda),
                          lse);
        },
        "attention_fwd: head dim 300 is above the CUDA limit 256");
}

}  // namespace
}  // namespace mt::ops::test
