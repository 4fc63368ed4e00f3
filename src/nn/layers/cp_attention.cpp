// Context-parallel attention: the dispatch by mode, and all-gather attention (two key-prefix attentions per rank over
// the gathered keys). The ring is cp_attention_ring.cpp.
#include "nn/layers/cp_attention.h"

#include "nn/segments.h"
#include "ops/attention.h"
#include "parallel/comm.h"

namespace mt::nn {

namespace {

// The key-prefix mask of a chunk whose causal prefix ends at `hi`: the document map of keys [0, hi) in global
// positions (undefined: one document per row).
ops::AttentionMask prefix_mask(const CpBatch& batch, int64_t hi, core::Device device) {
    if (!batch.host_doc_start.defined()) return {};
    return {.doc_start = doc_map_from(batch.host_doc_start, 0, hi, device)};
}

// Columns [first, first + count) of a [B, H, L] row-statistics tensor (lse), as a contiguous copy.
core::Tensor stat_cols(const core::Tensor& t, int64_t first, int64_t count) {
    return t.slice(2, first, first + count).clone();
}

}  // namespace

std::pair<core::Tensor, core::Tensor> CpAttention::gather_keys(const Tensor& k, const Tensor& v) const {
    core::Shape shape = k.shape();
    shape[1] = batch_.total;
    const Tensor kw = Tensor::scratch(shape, k.dtype(), k.device());
    const Tensor vw = Tensor::scratch(shape, v.dtype(), v.device());
    cp_gather_rows(cp_, k, kw);
    cp_gather_rows(cp_, v, vw);
    return {kw, vw};
}

void CpAttention::forward(const Tensor& q,
                          const Tensor& k,
                          const Tensor& v,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& max_logit) const {
    const parallel::Zigzag z = cp_.layout(batch_.total);
    MT_CHECK(q.size(1) == z.local(), "context-parallel attention over {} local tokens, not {}", z.local(), q.size(1));
    const Io io{.q = q, .k = k, .v = v, .out = out, .lse = lse};
    if (cp_.attn == CpAttnMode::ring)
        ring_forward(io, max_logit);
    else
        allgather_forward(io, max_logit);
}

void CpAttention::backward(const Tensor& q,
                           const Tensor& k,
                           const Tensor& v,
                           const Tensor& out,
                           const Tensor& lse,
                           const Tensor& dout,
                           const Tensor& dq,
                           const Tensor& dk,
                           const Tensor& dv) const {
    const Io io{.q = q, .k = k, .v = v, .out = out, .lse = lse};
    const Grads g{.dout = dout, .dq = dq, .dk = dk, .dv = dv};
    if (cp_.attn == CpAttnMode::ring)
        ring_backward(io, g);
    else
        allgather_backward(io, g);
}

void CpAttention::allgather_forward(const Io& io, const Tensor& max_logit) const {
    const auto& [q, k, v, out, lse] = io;
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    const auto [kw, vw] = gather_keys(k, v);
    for (int s = 0; s < 2; ++s) {
        const int64_t hi = z.span_first(s) + c;  // the chunk's last query sees keys [0, hi)
        const Tensor qs = time_rows(q, s * c, c);
        const Tensor os = Tensor::scratch(qs.shape(), out.dtype(), out.device());
        const Tensor ls = Tensor::scratch({q.size(0), q.size(2), c}, lse.dtype(), lse.device());
        const Tensor ms = max_logit.defined() ? Tensor::scratch(ls.shape(), ls.dtype(), ls.device()) : Tensor();
        ops::attention_fwd(
            qs, time_rows(kw, 0, hi), time_rows(vw, 0, hi), os, ls, {}, prefix_mask(batch_, hi, q.device()), ms);
        copy_time_rows(out, s * c, os, 0, c);
        lse.slice(2, s * c, (s + 1) * c).copy_from(ls);
        if (ms.defined()) max_logit.slice(2, s * c, (s + 1) * c).copy_from(ms);
    }
}

void CpAttention::allgather_backward(const Io& io, const Grads& g) const {
    const auto& [q, k, v, out, lse] = io;
    const auto& [dout, dq, dk, dv] = g;
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    const auto [kw, vw] = gather_keys(k, v);
    // This rank's queries' part of every key's gradient, summed over the ranks by the reduce-scatter.
    const Tensor dkw = Tensor::zeros(kw.shape(), kw.dtype(), kw.device());
    const Tensor dvw = Tensor::zeros(vw.shape(), vw.dtype(), vw.device());
    for (int s = 0; s < 2; ++s) {
        const int64_t hi = z.span_first(s) + c;
        const Tensor qs = time_rows(q, s * c, c);
        const Tensor dqs = Tensor::scratch(qs.shape(), dq.dtype(), dq.device());
        core::Shape kv_shape = kw.shape();
        kv_shape[1] = hi;
        const Tensor dks = Tensor::scratch(kv_shape, dkw.dtype(), dkw.device());
        const Tensor dvs = Tensor::scratch(kv_shape, dvw.dtype(), dvw.device());
        ops::attention_bwd(qs,
                           time_rows(kw, 0, hi),
                           time_rows(vw, 0, hi),
                           time_rows(out, s * c, c),
                           stat_cols(lse, s * c, c),
                           time_rows(dout, s * c, c),
                           dqs,
                           dks,
                           dvs,
                           {},
                           prefix_mask(batch_, hi, q.device()));
        copy_time_rows(dq, s * c, dqs, 0, c);
        add_time_rows(dkw, 0, dks, 0, hi);
        add_time_rows(dvw, 0, dvs, 0, hi);
    }
    cp_reduce_scatter_rows(cp_, dkw, dk);
    cp_reduce_scatter_rows(cp_, dvw, dv);
}

double CpAttention::max_over_group(double value) const {
    cp_.group().all_reduce(&value, 1, parallel::CommType::f64, parallel::ReduceOp::max).wait();
    return value;
}

}  // namespace mt::nn
