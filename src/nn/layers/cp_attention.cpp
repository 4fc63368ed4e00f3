// Context-parallel attention: the dispatch by mode, and all-gather attention (two key-prefix attentions per rank over
// the gathered keys). The ring is cp_attention_ring.cpp.
#include "nn/layers/cp_attention.h"

#include "nn/segments.h"
#include "ops/attention.h"
#include "parallel/comm.h"

namespace mt::nn {

namespace {

// The key-prefix mask of a chunk whose keys are the positions [lo, hi): the document map of those keys, relative to
// lo (undefined: one document per row).
ops::AttentionMask prefix_mask(const CpBatch& batch, int64_t lo, int64_t hi, core::Device device) {
    return {.doc_start = batch.doc_map(lo, hi, device)};
}

// Columns [first, first + count) of a [B, H, L] row-statistics tensor (lse), as a contiguous copy.
core::Tensor stat_cols(const core::Tensor& t, int64_t first, int64_t count) {
    return t.slice(2, first, first + count).clone();
}

// Local chunk s (rows [s c, (s + 1) c)) of the queries attends to `keys`, `values` under `mask`: its rows of out,
// lse and (when defined) max_logit written.
void chunk_forward(const core::Tensor& q,
                   int s,
                   int64_t c,
                   const core::Tensor& keys,
                   const core::Tensor& values,
                   const ops::AttentionMask& mask,
                   const core::Tensor& out,
                   const core::Tensor& lse,
                   const core::Tensor& max_logit) {
    using core::Tensor;
    const Tensor qs = time_rows(q, s * c, c);
    const Tensor os = Tensor::scratch(qs.shape(), out.dtype(), out.device());
    const Tensor ls = Tensor::scratch({q.size(0), q.size(2), c}, lse.dtype(), lse.device());
    const Tensor ms = max_logit.defined() ? Tensor::scratch(ls.shape(), ls.dtype(), ls.device()) : Tensor();
    ops::attention_fwd(qs, keys, values, os, ls, {}, mask, ms);
    copy_time_rows(out, s * c, os, 0, c);
    lse.slice(2, s * c, (s + 1) * c).copy_from(ls);
    if (ms.defined()) max_logit.slice(2, s * c, (s + 1) * c).copy_from(ms);
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
    if (window_ > 0)
        window_forward(io, max_logit);
    else if (cp_.attn == CpAttnMode::ring)
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
    if (window_ > 0)
        window_backward(io, g);
    else if (cp_.attn == CpAttnMode::ring)
        ring_backward(io, g);
    else
        allgather_backward(io, g);
}

// All-gather attention is the segment path over a segment that is the whole sequence: the gathered keys start at
// its first position, each local chunk attends to the prefix of its last query.
void CpAttention::allgather_forward(const Io& io, const Tensor& max_logit) const {
    const auto& [q, k, v, out, lse] = io;
    const auto [kw, vw] = gather_keys(k, v);
    segment_forward(q, kw, vw, batch_.first, out, lse, max_logit);
}

void CpAttention::allgather_backward(const Io& io, const Grads& g) const {
    const auto& [q, k, v, out, lse] = io;
    const auto& [dout, dq, dk, dv] = g;
    const auto [kw, vw] = gather_keys(k, v);
    // This rank's queries' part of every key's gradient, summed over the ranks by the reduce-scatter.
    const Tensor dkw = Tensor::scratch(kw.shape(), kw.dtype(), kw.device());
    const Tensor dvw = Tensor::scratch(vw.shape(), vw.dtype(), vw.device());
    segment_backward(q, kw, vw, batch_.first, out, lse, dout, dq, dkw, dvw);
    cp_reduce_scatter_rows(cp_, dkw, dk);
    cp_reduce_scatter_rows(cp_, dvw, dv);
}

core::Tensor CpAttention::window_keys(const std::array<Tensor, 2>& halo, const Tensor& local, int s) const {
    const int64_t c = cp_.layout(batch_.total).chunk();
    const Tensor& h = halo[static_cast<size_t>(s)];
    const int64_t before = h.defined() ? h.size(1) : 0;
    core::Shape shape = local.shape();
    shape[1] = before + c;
    const Tensor keys = Tensor::scratch(shape, local.dtype(), local.device());
    if (before > 0) copy_time_rows(keys, 0, h, 0, before);
    copy_time_rows(keys, before, local, s * c, c);
    return keys;
}

void CpAttention::window_forward(const Io& io, const Tensor& max_logit) const {
    const auto& [q, k, v, out, lse] = io;
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    const std::array<Tensor, 2> hk = cp_rows_before(cp_, batch_.total, k, window_ - 1);
    const std::array<Tensor, 2> hv = cp_rows_before(cp_, batch_.total, v, window_ - 1);
    for (int s = 0; s < 2; ++s) {
        const Tensor keys = window_keys(hk, k, s), values = window_keys(hv, v, s);
        const int64_t lo = z.span_first(s) + c - keys.size(1);  // the first key's position
        ops::AttentionMask mask = prefix_mask(batch_, lo, z.span_first(s) + c, q.device());
        mask.window = window_;
        chunk_forward(q, s, c, keys, values, mask, out, lse, max_logit);
    }
}

void CpAttention::window_backward(const Io& io, const Grads& g) const {
    const auto& [q, k, v, out, lse] = io;
    const auto& [dout, dq, dk, dv] = g;
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    const std::array<Tensor, 2> hk = cp_rows_before(cp_, batch_.total, k, window_ - 1);
    const std::array<Tensor, 2> hv = cp_rows_before(cp_, batch_.total, v, window_ - 1);
    std::array<Tensor, 2> dhk, dhv;  // the halos' gradients, sent home below
    dk.zero();
    dv.zero();
    for (int s = 0; s < 2; ++s) {
        const Tensor keys = window_keys(hk, k, s), values = window_keys(hv, v, s);
        const int64_t rows = keys.size(1), before = rows - c, lo = z.span_first(s) + c - rows;
        const Tensor qs = time_rows(q, s * c, c);
        const Tensor dqs = Tensor::scratch(qs.shape(), dq.dtype(), dq.device());
        const Tensor dks = Tensor::scratch(keys.shape(), dk.dtype(), dk.device());
        const Tensor dvs = Tensor::scratch(values.shape(), dv.dtype(), dv.device());
        ops::AttentionMask mask = prefix_mask(batch_, lo, z.span_first(s) + c, q.device());
        mask.window = window_;
        ops::attention_bwd(qs,
                           keys,
                           values,
                           time_rows(out, s * c, c),
                           stat_cols(lse, s * c, c),
                           time_rows(dout, s * c, c),
                           dqs,
                           dks,
                           dvs,
                           {},
                           mask);
        copy_time_rows(dq, s * c, dqs, 0, c);
        add_time_rows(dk, s * c, dks, before, c);
        add_time_rows(dv, s * c, dvs, before, c);
        if (before > 0) {
            dhk[static_cast<size_t>(s)] = time_rows(dks, 0, before).clone();
            dhv[static_cast<size_t>(s)] = time_rows(dvs, 0, before).clone();
        }
    }
    cp_add_rows_before(cp_, batch_.total, dhk, dk, window_ - 1);
    cp_add_rows_before(cp_, batch_.total, dhv, dv, window_ - 1);
}

// Local chunk s's queries sit at whole-row positions [first + span_first(s), ... + c): they see the keys from key_lo
// up to their own, the first rows of `keys` (the layer's segment cache, or the gathered sequence: allgather_*).
void CpAttention::segment_forward(const Tensor& q,
                                  const Tensor& keys,
                                  const Tensor& values,
                                  int64_t key_lo,
                                  const Tensor& out,
                                  const Tensor& lse,
                                  const Tensor& max_logit) const {
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    MT_CHECK(q.size(1) == z.local() && keys.size(1) == batch_.first + batch_.total - key_lo,
             "context-parallel segment attention: {} local queries and {} keys from {} for a segment [{}, {})",
             q.size(1),
             keys.size(1),
             key_lo,
             batch_.first,
             batch_.first + batch_.total);
    for (int s = 0; s < 2; ++s) {
        const int64_t end = z.span_first(s) + c, rows = batch_.first + end - key_lo;
        ops::AttentionMask mask = prefix_mask(batch_, key_lo - batch_.first, end, q.device());
        mask.window = window_;
        chunk_forward(q, s, c, time_rows(keys, 0, rows), time_rows(values, 0, rows), mask, out, lse, max_logit);
    }
}

void CpAttention::segment_backward(const Tensor& q,
                                   const Tensor& keys,
                                   const Tensor& values,
                                   int64_t key_lo,
                                   const Tensor& out,
                                   const Tensor& lse,
                                   const Tensor& dout,
                                   const Tensor& dq,
                                   const Tensor& dk_all,
                                   const Tensor& dv_all) const {
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t c = z.chunk();
    dk_all.zero();
    dv_all.zero();
    for (int s = 0; s < 2; ++s) {
        const int64_t end = z.span_first(s) + c, rows = batch_.first + end - key_lo;
        ops::AttentionMask mask = prefix_mask(batch_, key_lo - batch_.first, end, q.device());
        mask.window = window_;
        const Tensor qs = time_rows(q, s * c, c);
        const Tensor dqs = Tensor::scratch(qs.shape(), dq.dtype(), dq.device());
        core::Shape kv_shape = keys.shape();
        kv_shape[1] = rows;
        const Tensor dks = Tensor::scratch(kv_shape, dk_all.dtype(), dk_all.device());
        const Tensor dvs = Tensor::scratch(kv_shape, dv_all.dtype(), dv_all.device());
        ops::attention_bwd(qs,
                           time_rows(keys, 0, rows),
                           time_rows(values, 0, rows),
                           time_rows(out, s * c, c),
                           stat_cols(lse, s * c, c),
                           time_rows(dout, s * c, c),
                           dqs,
                           dks,
                           dvs,
                           {},
                           mask);
        copy_time_rows(dq, s * c, dqs, 0, c);
        add_time_rows(dk_all, 0, dks, 0, rows);
        add_time_rows(dv_all, 0, dvs, 0, rows);
    }
}

double CpAttention::max_over_group(double value) const {
    cp_.group().all_reduce(&value, 1, parallel::CommType::f64, parallel::ReduceOp::max).wait();
    return value;
}

void CpAttention::max_over_group(std::vector<double>& values) const {
    if (values.empty()) return;
    cp_.group()
        .all_reduce(
            values.data(), static_cast<int64_t>(values.size()), parallel::CommType::f64, parallel::ReduceOp::max)
        .wait();
}

}  // namespace mt::nn
