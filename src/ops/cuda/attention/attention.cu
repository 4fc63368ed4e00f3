// CUDA GQA attention (causal, or bidirectional within documents): picks the tensor-core flash kernels for bf16
// with D a multiple of 8 up to 128 (wgmma on Hopper, flash_*_wgmma.cu; mma.sync elsewhere, flash_fwd.cu / flash_bwd.cu)
// or the simple kernels (f32, f16, or any other D <= 256; attention_generic.cu: the fp16 mode's attention is correct
// but not yet on tensor cores). Every family takes a key prefix (k, v of Tk >= T positions, the queries the last T).
// AttentionOptions::kernel overrides the choice (tests and benchmarks; a family that does not apply falls back).
// The wgmma backward is the 5-matmul kernel (flash_bwd_wgmma_fast.cu), its dq sums ordered with
// core::exec().deterministic on and as scheduled with it off, unless AttentionOptions::fast_bwd is false. Takes q, k,
// v, out, dout, dq, dk, dv all bf16, all f16 or all f32, and lse f32 in every case. Shapes are checked by the caller
// (ops/attention.cpp).
#include <cmath>
#include <cstdint>
#include <string>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/attention.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int64_t kMaxHeadDim = 256;

AttnParams make_params(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& lse,
                       const AttentionMask& mask,
                       std::string_view op) {
    MT_CHECK(q.dtype() == DType::bf16 || q.dtype() == DType::f16 || q.dtype() == DType::f32,
             "{}: q has dtype {}; the CUDA attention takes bf16, f16 or f32",
             op,
             core::dtype_name(q.dtype()));
    MT_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(),
             "{}: k and v must have the dtype of q ({})",
             op,
             core::dtype_name(q.dtype()));
    MT_CHECK(lse.dtype() == DType::f32, "{}: lse has dtype {}, expected f32", op, core::dtype_name(lse.dtype()));
    MT_CHECK(q.size(3) <= kMaxHeadDim, "{}: head dim {} is above the CUDA limit {}", op, q.size(3), kMaxHeadDim);
    // Rows of q and of k are counted in int by the kernels (a warp per row in attention_generic.cu); Tk >= T.
    MT_CHECK(q.size(0) * q.size(1) * q.size(2) < (int64_t{1} << 31) &&
                 k.size(0) * k.size(1) * k.size(2) < (int64_t{1} << 31) && k.size(1) < (int64_t{1} << 24),
             "{}: q of shape {} with k of shape {} is too large for the CUDA kernels",
             op,
             core::shape_str(q.shape()),
             core::shape_str(k.shape()));
    AttnParams p;
    p.q = q.raw();
    p.k = k.raw();
    p.v = v.raw();
    p.lse = static_cast<float*>(lse.raw());
    p.b = static_cast<int>(q.size(0));
    p.t = static_cast<int>(q.size(1));
    p.tk = static_cast<int>(k.size(1));
    p.off = p.tk - p.t;  // the key prefix: query i sits at key position off + i
    p.hq = static_cast<int>(q.size(2));
    p.hkv = static_cast<int>(k.size(2));
    p.d = static_cast<int>(q.size(3));
    p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d)));
    // The mask (ops/attention.cpp checked it): a window of at least Tk is no window (the last query, at position
    // Tk - 1, sees key 0 with it), and one below Tk keeps the kernels' position arithmetic inside int.
    p.doc_start = mask.doc_start.defined() ? mask.doc_start.data<int32_t>() : nullptr;
    p.window = mask.window > 0 && mask.window < k.size(1) ? static_cast<int>(mask.window) : 0;
    p.causal = mask.causal;
    return p;
}

enum class Kernel { generic, mma, wgmma };

bool aligned16(const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// The tensor-core kernels move rows in 16-byte pieces: every bf16 tensor must start 16-byte aligned. Bidirectional
// attention (causal false) takes them too, each flash kernel having a bidirectional instantiation; only without a
// window, which ops/attention.cpp refuses with it anyway.
Kernel pick_kernel(const AttnParams& p, DType dtype, AttentionKernel requested) {
    if (dtype != DType::bf16 || !flash_supports(p.d) || (!p.causal && p.window > 0)) return Kernel::generic;
    const void* ptrs[] = {p.q, p.k, p.v, p.out, p.dout, p.out_w, p.dq, p.dk, p.dv};
    for (const void* ptr : ptrs)
        if (ptr != nullptr && !aligned16(ptr)) return Kernel::generic;
    if (requested == AttentionKernel::generic) return Kernel::generic;
    if (requested == AttentionKernel::mma) return Kernel::mma;
    return flash_wgmma_supported() ? Kernel::wgmma : Kernel::mma;
}

const char* kernel_name(Kernel kernel) {
    switch (kernel) {
        case Kernel::wgmma:
            return "cuda-wgmma";
        case Kernel::mma:
            return "cuda-mma";
        case Kernel::generic:
            return "cuda-generic";
    }
    return "?";
}

}  // namespace

void attention_fwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const AttentionOptions& options,
                   const AttentionMask& mask,
                   const Tensor& max_logit) {
    constexpr std::string_view op = "attention_fwd";
    AttnParams p = make_params(q, k, v, lse, mask, op);
    MT_CHECK(out.dtype() == q.dtype(), "{}: out must have the dtype of q", op);
    p.out_w = out.raw();
    if (max_logit.defined()) {  // every family writes it beside lse
        MT_CHECK(max_logit.dtype() == DType::f32,
                 "{}: max_logit has dtype {}, expected f32 (the dtype of lse)",
                 op,
                 core::dtype_name(max_logit.dtype()));
        p.max_logit = static_cast<float*>(max_logit.raw());
    }
    if (q.numel() == 0) return;
    core::NvtxRange range("attention_fwd");
    const Kernel kernel = pick_kernel(p, q.dtype(), options.kernel);
    if (options.chosen != nullptr) *options.chosen = kernel_name(kernel);
    switch (kernel) {
        case Kernel::wgmma:
            return flash_fwd_wgmma(p);
        case Kernel::mma:
            return flash_fwd(p);
        case Kernel::generic:
            return attention_generic_fwd(p, q.dtype());
    }
}
MT_REGISTER_KERNEL(attention_fwd, cuda, attention_fwd, ::mt::ops::half_and_float_dtypes);

void attention_bwd(const Tensor& q,
                   const Tensor& k,
                   const Tensor& v,
                   const Tensor& out,
                   const Tensor& lse,
                   const Tensor& dout,
                   const Tensor& dq,
                   const Tensor& dk,
                   const Tensor& dv,
                   const AttentionOptions& options,
                   const AttentionMask& mask) {
    constexpr std::string_view op = "attention_bwd";
    AttnParams p = make_params(q, k, v, lse, mask, op);
    for (const Tensor* t : {&out, &dout, &dq, &dk, &dv})
        MT_CHECK(t->dtype() == q.dtype(),
                 "{}: out, dout, dq, dk and dv must have the dtype of q ({}); one has {}",
                 op,
                 core::dtype_name(q.dtype()),
                 core::dtype_name(t->dtype()));
    if (q.numel() == 0) return;
    core::NvtxRange range("attention_bwd");
    p.out = out.raw();
    p.dout = dout.raw();
    p.dq = dq.raw();
    p.dk = dk.raw();
    p.dv = dv.raw();
    core::Backend& be = core::backend_get(core::Device::cuda);
    const size_t delta_bytes = static_cast<size_t>(lse.numel()) * sizeof(float);
    auto* delta = static_cast<float*>(be.alloc_scratch(delta_bytes));  // every kernel writes it first
    p.delta = p.delta_w = delta;
    const Kernel kernel = pick_kernel(p, q.dtype(), options.kernel);
    // The 5-matmul wgmma backward (flash_bwd_wgmma_fast.cu) sums dq with float reductions: in the order they are
    // scheduled with core::exec().deterministic off, in a fixed order (the key blocks taking turns) with it on. It is
    // the default either way, being the faster (docs/PERFORMANCE.md); AttentionOptions::fast_bwd = false keeps the
    // two-kernel deterministic backward (flash_bwd_wgmma.cu: dq in its own kernel, which computes S and dP again).
    const bool fast = kernel == Kernel::wgmma && options.fast_bwd;
    const bool ordered = core::exec().deterministic;
    if (options.chosen != nullptr)
        *options.chosen = std::string(kernel_name(kernel)) + (!fast ? "" : ordered ? "-ordered" : "-fast");
    if (kernel != Kernel::wgmma) attention_delta(p, delta, q.dtype());  // the wgmma backward computes it itself
    switch (kernel) {
        case Kernel::wgmma:
            if (fast) {  // dq summed with float reductions in an fp32 buffer
                const size_t dq_accum_bytes = flash_bwd_wgmma_fast_accum_floats(p) * sizeof(float);
                const size_t turn_bytes = ordered ? flash_bwd_wgmma_fast_turns(p) * sizeof(int) : 0;
                p.dq_accum = static_cast<float*>(be.alloc_scratch(dq_accum_bytes));        // zeroed by the launch
                if (ordered) p.dq_turn = static_cast<int*>(be.alloc_scratch(turn_bytes));  // zeroed by the launch
                flash_bwd_wgmma_fast(p, ordered);
                be.free(p.dq_accum, dq_accum_bytes);
                if (ordered) be.free(p.dq_turn, turn_bytes);
            } else {
                flash_bwd_wgmma(p);
            }
            break;
        case Kernel::mma:
            flash_bwd(p);
            break;
        case Kernel::generic:
            attention_generic_bwd(p, q.dtype());
            break;
    }
    be.free(delta, delta_bytes);  // stream order keeps the reuse safe
}
MT_REGISTER_KERNEL(attention_bwd, cuda, attention_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
