// KDA's state and conv halo across context-parallel spans: relay and affine recurrences, the halo exchange.
#include "nn/layers/kda_cp.h"

#include <algorithm>
#include <vector>

#include "nn/layers/conv_halo.h"
#include "nn/segments.h"
#include "parallel/comm.h"

namespace mt::nn {

using core::Tensor;

namespace {

// Message tags of the point-to-point moves (one pair of ranks may exchange several in one direction); the halo pairs
// take tag (towards rank r + 1) and tag + 1 (towards r - 1).
enum Tag : int { kHalo = 101, kHaloGrad = 103, kStateUp = 105, kStateDown };

parallel::CommType comm_type(const Tensor& t) {
    return parallel::comm_type_of(t.dtype());
}

// The first column of projection `which` in a packed [B, W - 1, C_q + C_k + C_v] halo.
int64_t column(const std::array<Tensor, 3>& parts, int which) {
    int64_t lo = 0;
    for (int i = 0; i < which; ++i) lo += parts[static_cast<size_t>(i)].size(2);
    return lo;
}

// The three [B, W - 1, C_i] parts side by side in one host tensor [B, W - 1, C_q + C_k + C_v] (one message).
Tensor pack(const std::array<Tensor, 3>& parts) {
    const Tensor& any = parts[0];
    const Tensor out = Tensor::scratch({any.size(0), any.size(1), column(parts, 3)}, any.dtype(), core::Device::cpu);
    for (int i = 0; i < 3; ++i)
        out.slice(2, column(parts, i), column(parts, i + 1)).copy_from(parts[static_cast<size_t>(i)]);
    return out;
}

}  // namespace

void KdaCp::begin(const CpBatch& batch, int64_t rows, core::Device device) {
    batch_ = batch;
    z_ = cp_.layout(batch.total);
    rows_ = rows;
    device_ = device;
    MT_CHECK(z_.chunk() > halo_rows_,
             "context-parallel KDA: chunks of {} tokens under a halo of {}",
             z_.chunk(),
             halo_rows_);
}

bool KdaCp::resets(int64_t chunk, int64_t b) const {
    if ((chunk == 0 && !batch_.continues()) || !batch_.host_doc_start.defined()) return false;
    return batch_.starts_document(b, chunk * z_.chunk());
}

void KdaCp::zero_resets(int64_t chunk, const Tensor& state) const {
    for (int64_t b = 0; b < rows_; ++b)
        if (resets(chunk, b)) state.select(0, b).zero();
}

Tensor KdaCp::doc_map(int s, int64_t lo_rows) const {
    const int64_t first = z_.span_first(s);
    return batch_.doc_map(first - lo_rows, first + z_.chunk(), device_);
}

// ---- the short convs' halos

void KdaCp::exchange_halos(const std::array<Tensor, 3>& proj) {
    if (halo_rows_ == 0) return;
    const int64_t c = z_.chunk(), w1 = halo_rows_, r = cp_.rank;
    // Each span's last W - 1 rows of the three projections, packed.
    std::array<Tensor, 2> tail, in;
    for (int s = 0; s < 2; ++s) {
        std::array<Tensor, 3> rows;
        for (size_t i = 0; i < 3; ++i) rows[i] = time_rows(proj[i], (s + 1) * c - w1, w1);
        tail[s] = pack(rows);
        in[s] = Tensor::zeros(tail[s].shape(), tail[s].dtype(), core::Device::cpu);
    }
    // Span 0's halo is rank r - 1's span 0 tail; span 1's is rank r + 1's span 1 tail (rank cp - 1: its own span 0).
    swap_with_neighbours(tail[0], tail[1], in[0], in[1], kHalo);
    if (r == cp_.size - 1) in[1] = tail[0];
    for (int s = 0; s < 2; ++s)
        for (size_t i = 0; i < 3; ++i) {
            auto& h = halo_[static_cast<size_t>(s)][i];
            if (s == 0 && r == 0) {  // the sequence's first span: no rows before it, or the segment before's
                h = batch_.continues() ? carry_halo_[i] : Tensor();
                continue;
            }
            const int64_t lo = column(proj, static_cast<int>(i)), cols = proj[i].size(2);
            h = on_device(in[s].slice(2, lo, lo + cols).clone(), device_);
        }
}

void KdaCp::conv_forward(int which, const Tensor& x, const Tensor& w, const Tensor& y) const {
    const int64_t c = z_.chunk();
    for (int s = 0; s < 2; ++s) {
        const Tensor& halo = halo_[static_cast<size_t>(s)][static_cast<size_t>(which)];
        const Tensor ys = Tensor::scratch({rows_, c, y.size(2)}, y.dtype(), y.device());
        conv_halo_forward(halo, time_rows(x, s * c, c), w, ys, doc_map(s, halo.defined() ? halo_rows_ : 0));
        copy_time_rows(y, s * c, ys, 0, c);
    }
}

void KdaCp::conv_backward(
    int which, const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw) {
    const int64_t c = z_.chunk();
    for (int s = 0; s < 2; ++s) {
        const Tensor& halo = halo_[static_cast<size_t>(s)][static_cast<size_t>(which)];
        const Tensor dxs = Tensor::scratch({rows_, c, dx.size(2)}, dx.dtype(), dx.device());
        dhalo_[static_cast<size_t>(s)][static_cast<size_t>(which)] =
            conv_halo_backward(halo,
                               time_rows(x, s * c, c),
                               w,
                               time_rows(dy, s * c, c),
                               dxs,
                               dw,
                               doc_map(s, halo.defined() ? halo_rows_ : 0));
        copy_time_rows(dx, s * c, dxs, 0, c);
    }
}

std::array<Tensor, 3> KdaCp::return_halo_grads(const std::array<Tensor, 3>& dproj) {
    if (halo_rows_ == 0) return {};
    // Rank 0's first span reads the segment before's halo (set_carry): its gradient is the caller's.
    const std::array<Tensor, 3> carried = cp_.rank == 0 && batch_.continues() ? dhalo_[0] : std::array<Tensor, 3>{};
    const int64_t c = z_.chunk(), w1 = halo_rows_;
    // Packed like the halos: out[s] is the gradient of span s's halo, in[s] that of span s's own tail.
    std::array<Tensor, 2> out, in;
    for (int s = 0; s < 2; ++s) {
        std::array<Tensor, 3> parts = dhalo_[static_cast<size_t>(s)];
        for (size_t i = 0; i < 3; ++i)  // the sequence's first span has no halo: zeros
            if (!parts[i].defined()) parts[i] = Tensor::zeros({rows_, w1, dproj[i].size(2)}, dproj[i].dtype());
        out[s] = pack(parts);
        in[s] = Tensor::zeros(out[s].shape(), out[s].dtype(), core::Device::cpu);
    }
    // Span 0's halo gradient goes back to rank r - 1, span 1's to rank r + 1 (rank cp - 1: its own span 0 tail).
    swap_with_neighbours(out[1], out[0], in[1], in[0], kHaloGrad);
    if (cp_.rank == cp_.size - 1) in[0] = out[1];
    for (int s = 0; s < 2; ++s)
        for (size_t i = 0; i < 3; ++i) {
            const Tensor& d = dproj[i];
            const int64_t lo = column(dproj, static_cast<int>(i));
            const Tensor part = in[s].slice(2, lo, lo + d.size(2)).clone();
            add_time_rows(d, (s + 1) * c - w1, on_device(part, d.device()), 0, w1);
        }
    dhalo_ = {};
    return carried;
}

void KdaCp::swap_with_neighbours(
    const Tensor& to_next, const Tensor& to_prev, const Tensor& from_prev, const Tensor& from_next, int tag) const {
    parallel::Comm& comm = cp_.group();
    const int64_t r = cp_.rank, last = cp_.size - 1;
    const auto type = comm_type(to_next);
    const int64_t n = to_next.numel();
    // Messages to rank r + 1 carry `tag`, those to rank r - 1 `tag + 1`; the receives are posted first.
    std::vector<parallel::CommWork> pending;
    if (r > 0) pending.push_back(comm.recv(from_prev.raw(), n, type, static_cast<int>(r - 1), tag));
    if (r < last) pending.push_back(comm.recv(from_next.raw(), n, type, static_cast<int>(r + 1), tag + 1));
    if (r < last) pending.push_back(comm.send(to_next.raw(), n, type, static_cast<int>(r + 1), tag));
    if (r > 0) pending.push_back(comm.send(to_prev.raw(), n, type, static_cast<int>(r - 1), tag + 1));
    for (auto& w : pending) w.wait();
}

// ---- the recurrence

KdaCp::Span KdaCp::span(int s,
                        const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& g,
                        const Tensor& beta,
                        const ops::KdaOptions& options) const {
    const int64_t c = z_.chunk(), first = s * c;
    Span sp{.q = time_rows(q, first, c),
            .k = time_rows(k, first, c),
            .v = time_rows(v, first, c),
            .g = time_rows(g, first, c),
            .beta = time_rows(beta, first, c),
            .options = options};
    sp.options.doc_start = doc_map(s, 0);
    return sp;
}

Tensor KdaCp::zero_state(const Span& sp) const {
    return Tensor::zeros({rows_, sp.v.size(2), sp.q.size(3), sp.v.size(3)}, sp.q.dtype(), device_);
}

Tensor KdaCp::span_forward(int s, const Span& sp, const Tensor& o) const {
    const Tensor os = Tensor::scratch(sp.v.shape(), o.dtype(), o.device());
    const Tensor st = zero_state(sp);
    ops::kda_fwd(sp.q, sp.k, sp.v, sp.g, sp.beta, s_in_[static_cast<size_t>(s)], os, st, sp.options);
    copy_time_rows(o, s * z_.chunk(), os, 0, z_.chunk());
    return st;
}

Tensor KdaCp::span_backward(
    int s, const Span& sp, const Tensor& d_o, const Tensor& dst, const std::array<Tensor, 5>& grads) const {
    const int64_t c = z_.chunk();
    const Tensor* in[5] = {&sp.q, &sp.k, &sp.v, &sp.g, &sp.beta};
    std::array<Tensor, 5> d;
    for (size_t i = 0; i < 5; ++i) d[i] = Tensor::scratch(in[i]->shape(), in[i]->dtype(), in[i]->device());
    const Tensor ds0 = zero_state(sp);
    ops::kda_bwd(sp.q,
                 sp.k,
                 sp.v,
                 sp.g,
                 sp.beta,
                 s_in_[static_cast<size_t>(s)],
                 time_rows(d_o, s * c, c),
                 dst,
                 d[0],
                 d[1],
                 d[2],
                 d[3],
                 d[4],
                 ds0,
                 sp.options);
    for (size_t i = 0; i < 5; ++i)
        if (grads[i].defined()) copy_time_rows(grads[i], s * c, d[i], 0, c);
    return ds0;
}

void KdaCp::forward(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const ops::KdaOptions& options,
                    const Tensor& o,
                    const Tensor& st) {
    MT_CHECK(q.size(1) == z_.local(), "context-parallel KDA over {} local tokens, not {}", z_.local(), q.size(1));
    const Span spans[2] = {span(0, q, k, v, g, beta, options), span(1, q, k, v, g, beta, options)};
    if (cp_.kda == CpKdaMode::relay) {
        relay_forward(spans, o, st);
        return;
    }
    affine_starts(spans, st);
    for (int s = 0; s < 2; ++s) span_forward(s, spans[s], o);
}

void KdaCp::relay_forward(const Span (&spans)[2], const Tensor& o, const Tensor& st) {
    parallel::Comm& comm = cp_.group();
    const int64_t r = cp_.rank, last = cp_.size - 1;
    std::vector<parallel::CommWork> sends;
    // Span 0 (chunk r) continues rank r - 1's span 0; span 1 (chunk 2 cp - 1 - r) rank r + 1's span 1, or at rank
    // cp - 1 its own span 0 (chunks cp - 1 and cp are neighbours).
    std::array<Tensor, 2> s_out;
    for (int s = 0; s < 2; ++s) {
        Tensor& s_in = s_in_[static_cast<size_t>(s)];
        s_in = zero_state(spans[s]);
        const auto type = comm_type(s_in);
        if (s == 0 && r > 0) comm.recv(s_in.raw(), s_in.numel(), type, static_cast<int>(r - 1), kStateUp).wait();
        if (s == 1 && r < last) comm.recv(s_in.raw(), s_in.numel(), type, static_cast<int>(r + 1), kStateDown).wait();
        if (s == 1 && r == last) s_in.copy_from(s_out[0]);
        if (s == 0 && r == 0 && batch_.continues() && carry_s0_.defined()) s_in.copy_from(carry_s0_);
        zero_resets(z_.span_chunk(s), s_in);
        s_out[static_cast<size_t>(s)] = span_forward(s, spans[s], o);
        const Tensor& out = s_out[static_cast<size_t>(s)];
        if (s == 0 && r < last)
            sends.push_back(comm.send(out.raw(), out.numel(), type, static_cast<int>(r + 1), kStateUp));
        if (s == 1 && r > 0)
            sends.push_back(comm.send(out.raw(), out.numel(), type, static_cast<int>(r - 1), kStateDown));
    }
    for (auto& w : sends) w.wait();
    st.copy_from(s_out[1]);
}

Tensor KdaCp::affine_maps(const Span (&spans)[2]) const {
    // Value columns [0, V) carry the span's values from the zero state (h); columns [V, V + K) zero values from the
    // identity, so they hold M I = M at the end (the recurrence acts on each value column alike).
    const Span& sp0 = spans[0];
    const int64_t hv = sp0.v.size(2), kd = sp0.q.size(3), vd = sp0.v.size(3);
    const Tensor maps = Tensor::zeros({2, rows_, hv, kd, vd + kd}, sp0.q.dtype(), core::Device::cpu);
    Tensor s0 = Tensor::zeros({rows_, hv, kd, vd + kd}, sp0.q.dtype(), core::Device::cpu);
    for (int64_t i = 0; i < rows_ * hv; ++i)
        for (int64_t j = 0; j < kd; ++j) core::tensor_set_flat(s0, (i * kd + j) * (vd + kd) + vd + j, 1.0);
    s0 = on_device(s0, device_);
    for (int s = 0; s < 2; ++s) {
        const Span& sp = spans[s];
        const Tensor v_ext = Tensor::zeros({rows_, z_.chunk(), hv, vd + kd}, sp.v.dtype(), device_);
        v_ext.slice(3, 0, vd).copy_from(sp.v);
        const Tensor o_ext = Tensor::scratch(v_ext.shape(), v_ext.dtype(), device_);
        const Tensor st_ext = Tensor::scratch(s0.shape(), s0.dtype(), device_);
        ops::kda_fwd(sp.q, sp.k, v_ext, sp.g, sp.beta, s0, o_ext, st_ext, sp.options);
        maps.select(0, s).copy_from(st_ext);
    }
    return maps;
}

void KdaCp::affine_starts(const Span (&spans)[2], const Tensor& st) {
    const Tensor mine = affine_maps(spans);
    const int64_t hv = mine.size(2), kd = mine.size(3), vd = mine.size(4) - kd, cp = cp_.size;
    core::Shape all_shape = mine.shape();
    all_shape.insert(all_shape.begin(), cp);
    const Tensor all = Tensor::scratch(all_shape, mine.dtype(), core::Device::cpu);
    cp_.group().all_gather(mine, all).wait();
    maps_ = all.to(core::DType::f64);
    // The fold, in global chunk order, in f64 on the host: S_in(g) = S_out(g - 1) (zero at a document start),
    // S_out(g) = M_g S_in(g) + h_g.
    const int64_t heads = rows_ * hv, state = kd * vd;
    std::vector<double> s_in(static_cast<size_t>(heads * state), 0.0), s_out(s_in.size(), 0.0);
    if (batch_.continues() && carry_s0_.defined()) {  // the segment before's end state (every rank has it)
        const Tensor carried = carry_s0_.to_device(core::Device::cpu).to(core::DType::f64);
        std::copy_n(carried.data<double>(), s_out.size(), s_out.begin());
    }
    const double* m = maps_.data<double>();
    for (int64_t g = 0; g < 2 * cp; ++g) {
        s_in = s_out;
        for (int64_t b = 0; b < rows_; ++b)
            if (resets(g, b)) std::fill_n(s_in.begin() + b * hv * state, hv * state, 0.0);
        const parallel::ZigzagOwner o = z_.owner(g);
        const double* block = m + (o.rank * 2 + o.span) * heads * kd * (vd + kd);  // each head's [h | M]
        ops::kda_state_fold_fwd(heads, kd, vd, block, s_in.data(), s_out.data());
        for (int s = 0; s < 2; ++s)
            if (z_.span_chunk(s) == g) {
                Tensor start = Tensor::zeros({rows_, hv, kd, vd}, core::DType::f64);
                std::copy(s_in.begin(), s_in.end(), start.data<double>());
                s_in_[static_cast<size_t>(s)] = on_device(start.to(spans[0].q.dtype()), device_);
            }
    }
    Tensor end = Tensor::zeros(st.shape(), core::DType::f64);
    std::copy(s_out.begin(), s_out.end(), end.data<double>());
    st.copy_from(on_device(end.to(st.dtype()), st.device()));
}

Tensor KdaCp::backward(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& g,
                       const Tensor& beta,
                       const ops::KdaOptions& options,
                       const Tensor& d_o,
                       const Tensor& dq,
                       const Tensor& dk,
                       const Tensor& dv,
                       const Tensor& dg,
                       const Tensor& dbeta,
                       const Tensor& d_end) const {
    const Span spans[2] = {span(0, q, k, v, g, beta, options), span(1, q, k, v, g, beta, options)};
    const std::array<Tensor, 5> grads = {dq, dk, dv, dg, dbeta};
    if (cp_.kda == CpKdaMode::affine) {
        Tensor ds0;
        const std::array<Tensor, 2> dst = affine_end_grads(spans, d_o, d_end, ds0);
        for (int s = 0; s < 2; ++s) span_backward(s, spans[s], d_o, dst[static_cast<size_t>(s)], grads);
        return batch_.continues() ? ds0 : Tensor();
    }
    // Relay, in reverse global order: span 1 (after rank r - 1's span 1, or the sequence's end at rank 0), then span
    // 0 (after rank r + 1's span 0, or at rank cp - 1 this rank's span 1).
    parallel::Comm& comm = cp_.group();
    const int64_t r = cp_.rank, last = cp_.size - 1;
    std::vector<parallel::CommWork> sends;
    std::array<Tensor, 2> ds_in;  // each span's start-state gradient, alive until its send completes
    for (int s = 1; s >= 0; --s) {
        Tensor dst = zero_state(spans[s]);
        const auto type = comm_type(dst);
        if (s == 1 && r > 0) comm.recv(dst.raw(), dst.numel(), type, static_cast<int>(r - 1), kStateDown).wait();
        if (s == 0 && r < last) comm.recv(dst.raw(), dst.numel(), type, static_cast<int>(r + 1), kStateUp).wait();
        if (s == 0 && r == last) dst = ds_in[1];
        if (s == 1 && r == 0 && d_end.defined()) dst.copy_from(d_end);  // the segment after's start gradient
        Tensor& out = ds_in[static_cast<size_t>(s)];
        out = span_backward(s, spans[s], d_o, dst, grads);
        zero_resets(z_.span_chunk(s), out);
        if (s == 1 && r < last)
            sends.push_back(comm.send(out.raw(), out.numel(), type, static_cast<int>(r + 1), kStateDown));
        if (s == 0 && r > 0)
            sends.push_back(comm.send(out.raw(), out.numel(), type, static_cast<int>(r - 1), kStateUp));
    }
    for (auto& w : sends) w.wait();
    return r == 0 && batch_.continues() ? ds_in[0] : Tensor();
}

std::array<Tensor, 2> KdaCp::affine_end_grads(const Span (&spans)[2],
                                              const Tensor& d_o,
                                              const Tensor& d_end,
                                              Tensor& ds0) const {
    // Each span's own start-state gradient: its backward with a zero end-state gradient (the input gradients of this
    // pass are discarded; the span's real backward below takes the true end gradient).
    const int64_t hv = spans[0].v.size(2), kd = spans[0].q.size(3), vd = spans[0].v.size(3), cp = cp_.size;
    const Tensor mine = Tensor::zeros({2, rows_, hv, kd, vd}, spans[0].q.dtype(), core::Device::cpu);
    for (int s = 0; s < 2; ++s) mine.select(0, s).copy_from(span_backward(s, spans[s], d_o, Tensor(), {}));
    const Tensor all = Tensor::scratch({cp, 2, rows_, hv, kd, vd}, mine.dtype(), core::Device::cpu);
    cp_.group().all_gather(mine, all).wait();
    const Tensor own = all.to(core::DType::f64);
    // The reverse fold: dS_out(last) = 0, dS_in(g) = M_g^T dS_out(g) + own(g), dS_out(g - 1) = dS_in(g) (zero where
    // chunk g starts a document).
    const int64_t heads = rows_ * hv, state = kd * vd;
    std::vector<double> d_out(static_cast<size_t>(heads * state), 0.0), d_in(d_out.size(), 0.0);
    if (d_end.defined()) {  // the segment after's start-state gradient (every rank has it)
        const Tensor end = d_end.to_device(core::Device::cpu).to(core::DType::f64);
        std::copy_n(end.data<double>(), d_out.size(), d_out.begin());
    }
    const double* m = maps_.data<double>();
    const double* e = own.data<double>();
    std::array<Tensor, 2> dst;
    for (int64_t g = 2 * cp - 1; g >= 0; --g) {
        const parallel::ZigzagOwner o = z_.owner(g);
        for (int s = 0; s < 2; ++s)
            if (z_.span_chunk(s) == g) {
                Tensor end = Tensor::zeros({rows_, hv, kd, vd}, core::DType::f64);
                std::copy(d_out.begin(), d_out.end(), end.data<double>());
                dst[static_cast<size_t>(s)] = on_device(end.to(spans[0].q.dtype()), device_);
            }
        const double* block = m + (o.rank * 2 + o.span) * heads * kd * (vd + kd);
        const double* ext = e + (o.rank * 2 + o.span) * heads * state;
        ops::kda_state_fold_bwd(heads, kd, vd, block, ext, d_out.data(), d_in.data());
        d_out = d_in;
        for (int64_t b = 0; b < rows_; ++b)
            if (resets(g, b)) std::fill_n(d_out.begin() + b * hv * state, hv * state, 0.0);
    }
    Tensor start = Tensor::zeros({rows_, hv, kd, vd}, core::DType::f64);
    std::copy(d_out.begin(), d_out.end(), start.data<double>());
    ds0 = on_device(start.to(spans[0].q.dtype()), device_);
    return dst;
}

}  // namespace mt::nn
