// Window layers' snapshots and carried gradients across sequence segments.
#include "nn/layers/window_kv.h"

#include <tuple>

namespace mt::nn {

using core::Tensor;

void WindowKv::configure(
    int64_t kv_heads, int64_t head_dim, core::DType dtype, core::Device device, bool offload, int64_t window) {
    heads_ = kv_heads;
    dim_ = head_dim;
    dtype_ = dtype;
    device_ = device;
    offload_ = offload;
    window_ = window;
}

void WindowKv::clear() {
    snapshots_.clear();
    snapshot_ = {};
    pending_dk_ = pending_dv_ = Tensor();
    pending_lo_ = pending_end_ = 0;
    seg_ = SegmentContext{};
}

void WindowKv::begin(const SegmentContext& seg, int64_t batch) {
    seg_ = seg;
    batch_ = batch;
    lo_ = lo(seg.first);
    if (seg.index == 0 && !seg.recompute) snapshots_.assign(static_cast<size_t>(seg.count), {});
    const auto& [k, v] = snapshots_[static_cast<size_t>(seg.index)];
    MT_CHECK(prefix_rows() == 0 || (k.defined() && k.size(1) == prefix_rows()),
             "window segment {} at {}: no snapshot of the {} keys before it (segments run in order)",
             seg.index,
             seg.first,
             prefix_rows());
    snapshot_ = {on_device(k, device_), on_device(v, device_)};
}

void WindowKv::take_snapshot(const Tensor& keys, const Tensor& values, int64_t range_lo, int64_t first, int64_t index) {
    const int64_t from = lo(first), rows = first - from;
    auto take = [&](const Tensor& src) {
        const Tensor t = Tensor::scratch({batch_, rows, heads_, dim_}, dtype_, device_);
        copy_time_rows(t, 0, src, from - range_lo, rows);
        return keep_for_later(t, offload_);
    };
    snapshots_[static_cast<size_t>(index)] = {take(keys), take(values)};
}

std::pair<Tensor, Tensor> WindowKv::keys(const Tensor& k, const Tensor& v) {
    const int64_t prefix = prefix_rows(), len = seg_.length, tk = key_rows();
    std::pair<Tensor, Tensor> out;
    for (auto [all, own, snap] :
         {std::tuple{&out.first, &k, &snapshot_.first}, std::tuple{&out.second, &v, &snapshot_.second}}) {
        *all = Tensor::scratch({batch_, tk, heads_, dim_}, dtype_, device_);
        if (prefix > 0) copy_time_rows(*all, 0, *snap, 0, prefix);
        copy_time_rows(*all, prefix, *own, 0, len);
    }
    // The next segment's snapshot: rows [lo(next), next) of these, next = first + len (lo(next) >= lo).
    if (!seg_.recompute && seg_.index + 1 < seg_.count)
        take_snapshot(out.first, out.second, lo_, seg_.first + len, seg_.index + 1);
    return out;
}

void WindowKv::backward_grads(const Tensor& dk_all, const Tensor& dv_all, const Tensor& d_k, const Tensor& d_v) {
    const int64_t prefix = prefix_rows(), len = seg_.length, first = seg_.first;
    if (seg_.index == seg_.count - 1) pending_dk_ = pending_dv_ = Tensor(), pending_lo_ = pending_end_ = first + len;
    MT_CHECK(pending_end_ == first + len, "window segment {}: backward out of order", seg_.index);
    // Rows [pending_lo_, first + len) got gradients from later segments: those in [first, first + len) are this
    // segment's; those before it (a segment shorter than the window) pass on with this segment's own prefix rows.
    const int64_t own_from = std::max(pending_lo_, first);
    const int64_t new_lo = lo_;
    Tensor next_dk, next_dv;
    if (prefix > 0) {
        next_dk = Tensor::scratch({batch_, prefix, heads_, dim_}, dtype_, device_);
        next_dv = Tensor::scratch({batch_, prefix, heads_, dim_}, dtype_, device_);
    }
    for (auto [own, all, pending, next] :
         {std::tuple{&d_k, &dk_all, &pending_dk_, &next_dk}, std::tuple{&d_v, &dv_all, &pending_dv_, &next_dv}}) {
        copy_time_rows(*own, 0, *all, prefix, len);
        if (pending->defined() && own_from < first + len)
            add_time_rows(*own, own_from - first, *pending, own_from - pending_lo_, first + len - own_from);
        if (prefix == 0) continue;
        copy_time_rows(*next, 0, *all, 0, prefix);
        // pending_lo_ >= lo_: a later segment's window starts no earlier than this one's
        if (pending->defined() && pending_lo_ < first)
            add_time_rows(*next, pending_lo_ - new_lo, *pending, 0, first - pending_lo_);
    }
    pending_dk_ = next_dk, pending_dv_ = next_dv;
    pending_lo_ = new_lo, pending_end_ = first;
}

}  // namespace mt::nn
