// Ring context-parallel attention (cp.attn = "ring"): the key/value shards travel the ring of the cp group while each
// step's attention merges into the running result by log-sum-exp (nn/layers/cp_attention.h describes the steps).
#include <algorithm>
#include <initializer_list>
#include <utility>

#include "nn/layers/cp_attention.h"
#include "nn/segments.h"
#include "ops/attention.h"
#include "ops/attention_past.h"
#include "parallel/comm.h"

namespace mt::nn {

using core::Tensor;

namespace {

// Message tags: the shards of the forward and the backward, and their gradient accumulators.
enum Tag : int { kRingKeys = 301, kRingGrads };

// Keys laid end to end from runs [first, first + n) of global positions, in increasing order: how many lie before
// position `start` (the index of the first key a query whose document starts there may see).
int32_t keys_before(int64_t start, std::initializer_list<std::pair<int64_t, int64_t>> runs) {
    int64_t n = 0;
    for (const auto& [first, len] : runs) n += std::clamp<int64_t>(start - first, 0, len);
    return static_cast<int32_t>(n);
}

// A rank's keys and values [B, L, Hkv, D] as one shard [2, B, L, Hkv, D] (one message a step).
Tensor pack(const Tensor& k, const Tensor& v) {
    core::Shape shape = k.shape();
    shape.insert(shape.begin(), 2);
    const Tensor shard = Tensor::scratch(shape, k.dtype(), k.device());
    shard.select(0, 0).copy_from(k);
    shard.select(0, 1).copy_from(v);
    return shard;
}

// The second local chunk's rows of the query-side tensors, as contiguous copies (the ops take whole tensors), and
// their writing back.
struct SecondChunk {
    Tensor q, out, lse, max_logit, dout, dq;
};

SecondChunk second_chunk(int64_t c, const Tensor& q, const Tensor& out, const Tensor& lse, const Tensor& max_logit) {
    auto cols = [&](const Tensor& t) { return t.defined() ? t.slice(2, c, 2 * c).clone() : Tensor(); };
    return {.q = time_rows(q, c, c).clone(),
            .out = time_rows(out, c, c).clone(),
            .lse = cols(lse),
            .max_logit = cols(max_logit),
            .dout = Tensor(),
            .dq = Tensor()};
}

}  // namespace

std::vector<parallel::CommWork> CpAttention::ring_pass(const Tensor& held, const Tensor& next, int tag) const {
    parallel::Comm& comm = cp_.group();
    const auto n = cp_.size, r = cp_.rank;
    const auto type = parallel::comm_type_of(held.dtype());
    std::vector<parallel::CommWork> pending;
    pending.push_back(comm.recv(next.raw(), next.numel(), type, static_cast<int>((r + n - 1) % n), tag));
    pending.push_back(comm.send(held.raw(), held.numel(), type, static_cast<int>((r + 1) % n), tag));
    return pending;
}

Tensor CpAttention::ring_local_map(core::Device device) const {
    if (!batch_.host_doc_start.defined()) return {};
    const parallel::Zigzag z = cp_.layout(batch_.total);
    const int64_t b = batch_.host_doc_start.size(0), c = z.chunk(), total = batch_.total;
    // The local positions keep the global order, so each query's visible local keys run from the first one at or
    // after its document's start up to itself: a document map over the local rows.
    const Tensor map = Tensor::zeros({b, z.local()}, core::DType::i32);
    const int32_t* host = batch_.host_doc_start.data<int32_t>();
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t i = 0; i < z.local(); ++i)
            map.data<int32_t>()[bb * z.local() + i] =
                keys_before(host[bb * total + z.position(i)], {{z.span_first(0), c}, {z.span_first(1), c}});
    return on_device(map, device);
}

Tensor CpAttention::ring_first_keys(int64_t j, core::Device device) const {
    if (!batch_.host_doc_start.defined()) return {};
    const parallel::Zigzag z = cp_.layout(batch_.total), of_j = parallel::zigzag(cp_.size, j, batch_.total);
    const int64_t b = batch_.host_doc_start.size(0), c = z.chunk(), total = batch_.total;
    const bool both = j > cp_.rank;  // the second local chunk's queries over both of rank j's chunks
    const int64_t first_query = both ? c : 0, queries = both ? c : 2 * c;
    const Tensor map = Tensor::zeros({b, queries}, core::DType::i32);
    const int32_t* host = batch_.host_doc_start.data<int32_t>();
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t i = 0; i < queries; ++i) {
            const int64_t start = host[bb * total + z.position(first_query + i)];
            map.data<int32_t>()[bb * queries + i] =
                both ? keys_before(start, {{of_j.span_first(0), c}, {of_j.span_first(1), c}})
                     : keys_before(start, {{of_j.span_first(0), c}});
        }
    return on_device(map, device);
}

void CpAttention::ring_forward(const Io& io, const Tensor& max_logit) const {
    const auto& [q, k, v, out, lse] = io;
    const int64_t c = cp_.layout(batch_.total).chunk(), n = cp_.size, r = cp_.rank;
    Tensor held = pack(k, v);
    for (int64_t i = 0; i < n; ++i) {
        // The shard goes on to rank r + 1 while this step computes on it.
        const Tensor next = i + 1 < n ? Tensor::scratch(held.shape(), held.dtype(), held.device()) : Tensor();
        std::vector<parallel::CommWork> pending;
        if (next.defined()) pending = ring_pass(held, next, kRingKeys);
        const int64_t j = (r - i + n) % n;
        const Tensor ks = held.select(0, 0), vs = held.select(0, 1);
        if (i == 0) {
            ops::attention_fwd(q, k, v, out, lse, {}, {.doc_start = ring_local_map(q.device())}, max_logit);
        } else if (j < r) {
            ops::attention_past_fwd(
                q, time_rows(ks, 0, c), time_rows(vs, 0, c), ring_first_keys(j, q.device()), out, lse, max_logit);
        } else {
            const SecondChunk s = second_chunk(c, q, out, lse, max_logit);
            ops::attention_past_fwd(s.q, ks, vs, ring_first_keys(j, q.device()), s.out, s.lse, s.max_logit);
            copy_time_rows(out, c, s.out, 0, c);
            lse.slice(2, c, 2 * c).copy_from(s.lse);
            if (max_logit.defined()) max_logit.slice(2, c, 2 * c).copy_from(s.max_logit);
        }
        for (auto& w : pending) w.wait();
        if (next.defined()) held = next;
    }
}

void CpAttention::ring_backward(const Io& io, const Grads& g) const {
    const auto& [q, k, v, out, lse] = io;
    const auto& [dout, dq, dk, dv] = g;
    const int64_t c = cp_.layout(batch_.total).chunk(), n = cp_.size, r = cp_.rank;
    // The shard held and its key/value gradient accumulator: each rank adds its queries' part and passes both on.
    Tensor held = pack(k, v), dheld = Tensor::zeros(held.shape(), held.dtype(), held.device());
    for (int64_t i = 0; i < n; ++i) {
        const int64_t j = (r - i + n) % n;
        const Tensor ks = held.select(0, 0), vs = held.select(0, 1), dks = dheld.select(0, 0), dvs = dheld.select(0, 1);
        if (i == 0) {  // dq, and the own shard's gradients, written
            ops::attention_bwd(q, k, v, out, lse, dout, dq, dks, dvs, {}, {.doc_start = ring_local_map(q.device())});
        } else if (j < r) {
            const Tensor dkb = Tensor::scratch({ks.size(0), c, ks.size(2), ks.size(3)}, ks.dtype(), ks.device());
            const Tensor dvb = Tensor::scratch(dkb.shape(), dkb.dtype(), dkb.device());
            ops::attention_past_bwd(q,
                                    time_rows(ks, 0, c),
                                    time_rows(vs, 0, c),
                                    ring_first_keys(j, q.device()),
                                    out,
                                    lse,
                                    dout,
                                    dq,
                                    dkb,
                                    dvb);
            add_time_rows(dks, 0, dkb, 0, c);
            add_time_rows(dvs, 0, dvb, 0, c);
        } else {
            SecondChunk s = second_chunk(c, q, out, lse, Tensor());
            s.dout = time_rows(dout, c, c).clone();
            s.dq = time_rows(dq, c, c).clone();
            const Tensor dkb = Tensor::scratch(ks.shape(), ks.dtype(), ks.device());
            const Tensor dvb = Tensor::scratch(dkb.shape(), dkb.dtype(), dkb.device());
            ops::attention_past_bwd(s.q, ks, vs, ring_first_keys(j, q.device()), s.out, s.lse, s.dout, s.dq, dkb, dvb);
            copy_time_rows(dq, c, s.dq, 0, c);
            add_time_rows(dks, 0, dkb, 0, 2 * c);
            add_time_rows(dvs, 0, dvb, 0, 2 * c);
        }
        // The shard and its gradients go on to rank r + 1; after the last step the gradients of the shard held, rank
        // r + 1's own, go home, and this rank's own arrive from rank r - 1 complete.
        std::vector<parallel::CommWork> pending;
        const Tensor next_grads = Tensor::scratch(dheld.shape(), dheld.dtype(), dheld.device());
        const Tensor next = i + 1 < n ? Tensor::scratch(held.shape(), held.dtype(), held.device()) : Tensor();
        pending = ring_pass(dheld, next_grads, kRingGrads);
        if (next.defined())
            for (auto& w : ring_pass(held, next, kRingKeys)) pending.push_back(std::move(w));
        for (auto& w : pending) w.wait();
        dheld = next_grads;
        if (next.defined()) held = next;
    }
    dk.copy_from(dheld.select(0, 0));
    dv.copy_from(dheld.select(0, 1));
}

}  // namespace mt::nn
