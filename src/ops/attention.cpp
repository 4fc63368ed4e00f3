// Entry points of GQA attention (causal or bidirectional): argument checks, then dispatch by device: CUDA tensors go to
// ops/cuda (q, k, v and the gradients bf16 or f32, lse f32), CPU tensors to the f32/f64 reference (lse in the dtype of
// q).
#include "ops/attention.h"

#include <initializer_list>
#include <utility>

#include "core/backend.h"
#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

using core::Device;

// The device-independent shape checks: q [B, T, Hq, D]; k, v [B, Tk, Hkv, D] with Tk >= T, Hq % Hkv == 0;
// lse [B, Hq, T].
void check_qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, std::string_view op) {
    const int64_t b = q.size(0), t = q.size(1), hq = q.size(2), d = q.size(3), hkv = k.size(2), tk = k.size(1);
    MT_CHECK(tk >= t,
             "{}: k has {} positions, fewer than the {} queries of q (the queries are the last positions of the keys)",
             op,
             tk,
             t);
    check_shape(k, {b, tk, hkv, d}, op, "k");
    check_shape(v, {b, tk, hkv, d}, op, "v");
    MT_CHECK(hkv > 0 && hq % hkv == 0, "{}: q has {} heads and k has {}; Hq must be a multiple of Hkv", op, hq, hkv);
    check_shape(lse, {b, hq, t}, op, "lse");
    MT_CHECK(d > 0, "{}: q has shape {}; the head dim D must be > 0", op, core::shape_str(q.shape()));
}

// Every tensor contiguous, of its rank and shape (the dtypes are the kernels' to check).
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, std::string_view op) {
    check_arg(q, op, "q", 4);
    check_arg(k, op, "k", 4);
    check_arg(v, op, "v", 4);
    check_arg(lse, op, "lse", 3);
    check_qkv_shapes(q, k, v, lse, op);
}

// The document map (over the key positions, on their device) and the window (>= 0; the CUDA kernels take int positions,
// and T < 2^24 there).
void check_mask(const AttentionMask& mask, const Tensor& k, std::string_view op) {
    if (mask.doc_start.defined()) cpu::check_doc_start_map(mask.doc_start, k, op, "mask.doc_start");
    MT_CHECK(mask.window >= 0 && mask.window < (int64_t{1} << 31),
             "{}: mask.window = {} must be >= 0 (0: no window) and below 2^31",
             op,
             mask.window);
    MT_CHECK(mask.causal || mask.window == 0,
             "{}: mask.window = {} with mask.causal = false; a sliding window is causal only",
             op,
             mask.window);
}

void require_cuda(std::string_view op) {
    if (!core::backend_available(Device::cuda))
        core::fail(core::ExitCode::device, "{}: got cuda tensors, but no CUDA device is available", op);
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
    const Device device = check_same_device(op, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}});
    check_qkv(q, k, v, lse, op);
    check_arg(out, op, "out", 4);
    check_shape(out, q.shape(), op, "out");
    if (max_logit.defined()) {  // optional; its dtype is that of lse (the kernels check it)
        check_same_device(op, {{"q", q}, {"max_logit", max_logit}});
        check_arg(max_logit, op, "max_logit", 3);
        check_shape(max_logit, lse.shape(), op, "max_logit");
    }
    check_mask(mask, k, op);
    if (device == Device::cuda) require_cuda(op);
    MT_CALL_KERNEL(attention_fwd, device, q, k, v, out, lse, options, mask, max_logit);
}

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
    const Device device = check_same_device(
        op,
        {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}});
    check_qkv(q, k, v, lse, op);
    const std::pair<const Tensor*, std::string_view> like_q[] = {{&out, "out"}, {&dout, "dout"}, {&dq, "dq"}};
    for (const auto& [t, name] : like_q) {
        check_arg(*t, op, name, 4);
        check_shape(*t, q.shape(), op, name);
    }
    const std::pair<const Tensor*, std::string_view> like_k[] = {{&dk, "dk"}, {&dv, "dv"}};
    for (const auto& [t, name] : like_k) {
        check_arg(*t, op, name, 4);
        check_shape(*t, k.shape(), op, name);
    }
    check_mask(mask, k, op);
    if (device == Device::cuda) require_cuda(op);
    MT_CALL_KERNEL(attention_bwd, device, q, k, v, out, lse, dout, dq, dk, dv, options, mask);
}

}  // namespace mt::ops
