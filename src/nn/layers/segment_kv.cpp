// Keys, values and their gradient accumulators across sequence segments, on the device or offloaded to the host.
#include "nn/layers/segment_kv.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/exec.h"

namespace mt::nn {

using core::Tensor;

void SegmentKv::configure(int64_t kv_heads, int64_t head_dim, core::DType dtype, core::Device device, bool offload) {
    heads_ = kv_heads;
    dim_ = head_dim;
    dtype_ = dtype;
    device_ = device;
    offload_ = offload;
}

void SegmentKv::clear() {
    k_ = v_ = dk_ = dv_ = Tensor();
    release_staged();
    seg_ = SegmentContext{};
}

void SegmentKv::begin(const SegmentContext& seg, int64_t batch, int64_t lo) {
    seg_ = seg;
    batch_ = batch;
    lo_ = lo;
    const core::Shape shape = {batch, seg.total, heads_, dim_};
    if (!k_.defined() || k_.shape() != shape) {
        for (Tensor* t : {&k_, &v_, &dk_, &dv_})
            *t = offload_ ? Tensor::zeros_pinned(shape, dtype_) : Tensor::zeros(shape, dtype_, device_);
        release_staged();
    }
    if (seg.index != 0 || seg.recompute) return;
    // A new sequence: its accumulators start at zero. On the host only the rows its backward writes are read
    // (written_), so the gigabytes of pinned memory are never cleared.
    ++generation_;
    written_.clear();
    if (!offload_) {
        dk_.zero();
        dv_.zero();
    }
}

Tensor SegmentKv::device_rows(int64_t rows) const {
    return Tensor::scratch({batch_, rows, heads_, dim_}, dtype_, device_);
}

void SegmentKv::prefetch(bool backward) {
    if (!offload_ || staged_for(backward)) return;
    const int64_t tk = key_rows(), prefix = prefix_rows();
    const bool keys_staged = staged_for(false);
    if (!keys_staged) {
        release_staged();
        sk_ = device_rows(tk), sv_ = device_rows(tk);
    }
    if (backward) {
        sdk_ = Tensor::zeros({batch_, tk, heads_, dim_}, dtype_, device_);
        sdv_ = Tensor::zeros({batch_, tk, heads_, dim_}, dtype_, device_);
    }
    // After everything queued on the main lane so far: the allocations above, and the copies to the host that
    // wrote the rows read here (an earlier segment's keys, a later segment's accumulator rows).
    core::lane_wait(core::Lane::side, core::Lane::main);
    core::ExecScope side({.lane = core::Lane::side, .deterministic = core::exec().deterministic});
    // The forward fills the segment's own key rows itself; the backward's re-run of it may not run (no recompute).
    const int64_t key_upload = backward ? tk : prefix;
    if (!keys_staged || backward) {
        copy_time_rows_async(sk_, 0, k_, lo_, key_upload);
        copy_time_rows_async(sv_, 0, v_, lo_, key_upload);
    }
    if (backward)  // the rows a later segment's backward wrote in this sequence; zero elsewhere
        for (const auto& [lo, hi] : written_) {
            const int64_t a = std::max(lo, lo_), b = std::min(hi, lo_ + tk);
            if (a >= b) continue;
            copy_time_rows_async(sdk_, a - lo_, dk_, a, b - a);
            copy_time_rows_async(sdv_, a - lo_, dv_, a, b - a);
        }
    stage_generation_ = generation_;
    stage_index_ = seg_.index;
    stage_backward_ = backward;
}

void SegmentKv::wait_staged(bool backward) {
    prefetch(backward);
    core::lane_wait(core::Lane::main, core::Lane::side);
}

void SegmentKv::release_staged() {
    // Copies still queued on the side lane (a prefetch never waited for) finish before the main lane reuses the
    // memory.
    if (sk_.defined()) core::lane_wait(core::Lane::main, core::Lane::side);
    sk_ = sv_ = sdk_ = sdv_ = Tensor();
    stage_generation_ = stage_index_ = -1;
    stage_backward_ = false;
}

std::pair<Tensor, Tensor> SegmentKv::forward_keys(const Tensor& k, const Tensor& v) {
    const int64_t tk = key_rows(), prefix = prefix_rows(), len = seg_.length;
    if (!offload_) {
        copy_time_rows(k_, seg_.first, k, 0, len);
        copy_time_rows(v_, seg_.first, v, 0, len);
        return {time_rows(k_, lo_, tk), time_rows(v_, lo_, tk)};
    }
    wait_staged(backward_phase_);
    if (!backward_phase_ && next_ != nullptr) next_->prefetch(false);  // overlaps this layer's attention
    copy_time_rows(sk_, prefix, k, 0, len);
    copy_time_rows(sv_, prefix, v, 0, len);
    if (!seg_.recompute) {  // the segment's keys to the host cache, once (a re-run computes the same)
        copy_time_rows_async(k_, seg_.first, k, 0, len);
        copy_time_rows_async(v_, seg_.first, v, 0, len);
    }
    return {sk_, sv_};
}

void SegmentKv::forward_done() {
    if (offload_ && !backward_phase_) release_staged();
}

std::pair<Tensor, Tensor> SegmentKv::backward_keys() {
    const int64_t tk = key_rows();
    if (!offload_) return {time_rows(k_, lo_, tk), time_rows(v_, lo_, tk)};
    wait_staged(true);
    if (prev_ != nullptr) prev_->prefetch(true);  // the next backward's layer, overlapping this one
    return {sk_, sv_};
}

void SegmentKv::backward_grads(const Tensor& dk_all, const Tensor& dv_all, const Tensor& d_k, const Tensor& d_v) {
    const int64_t prefix = prefix_rows(), len = seg_.length;
    if (!offload_) {
        for (auto [own, all, acc] : {std::tuple{&d_k, &dk_all, &dk_}, std::tuple{&d_v, &dv_all, &dv_}}) {
            copy_time_rows(*own, 0, *all, prefix, len);
            add_time_rows(*own, 0, *acc, seg_.first, len);
            add_time_rows(*acc, lo_, *all, 0, prefix);
        }
        return;
    }
    for (auto [own, all, staged, acc] :
         {std::tuple{&d_k, &dk_all, &sdk_, &dk_}, std::tuple{&d_v, &dv_all, &sdv_, &dv_}}) {
        copy_time_rows(*own, 0, *all, prefix, len);
        add_time_rows(*own, 0, *staged, prefix, len);
        add_time_rows(*staged, 0, *all, 0, prefix);
        copy_time_rows_async(*acc, lo_, *staged, 0, prefix);  // the updated rows back to the host
    }
    add_written(lo_, seg_.first);
    release_staged();
}

void SegmentKv::add_written(int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    written_.emplace_back(lo, hi);
    std::sort(written_.begin(), written_.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& r : written_)
        if (!merged.empty() && r.first <= merged.back().second)
            merged.back().second = std::max(merged.back().second, r.second);
        else
            merged.push_back(r);
    written_ = std::move(merged);
}

}  // namespace mt::nn
