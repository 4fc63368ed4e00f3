// The keys and values a sliding-window attention layer carries across sequence segments (long_context.md §4: "the
// last w of window layers"). A query of segment j sees at most the w - 1 positions before the segment, so the layer
// keeps, per segment, a snapshot of the (up to) w - 1 keys and values before its first position, taken in the
// forward (the backward re-runs segment j's forward from it), and the backward carries the gradient of those rows,
// at most w - 1 of them, to the segments that own them. Memory O(J w) instead of the whole sequence's cache that a
// global layer needs (nn/layers/segment_kv.h). With long.offload_kv the snapshots wait in pinned host memory.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/segments.h"

namespace mt::nn {

class WindowKv {
    using Tensor = core::Tensor;

   public:
    // window: w, a query sees itself and the w - 1 positions before it.
    void configure(
        int64_t kv_heads, int64_t head_dim, core::DType dtype, core::Device device, bool offload, int64_t window);
    // The segment the next forward and backward run (its first visible position is lo(first)).
    void begin(const SegmentContext& seg, int64_t batch);
    int64_t lo(int64_t first) const {
        return std::max<int64_t>(0, first - (window_ - 1));
    }
    void clear();

    // K, V [B, Tk, Hkv, D] over [lo, first + T): the snapshot before the segment, then its own k, v [B, T, Hkv, D].
    // The first forward of a segment also takes the next segment's snapshot from them.
    std::pair<core::Tensor, core::Tensor> keys(const core::Tensor& k, const core::Tensor& v);
    // Backward: dK, dV over the same rows from attention_bwd. Writes (=) the segment's own d_k, d_v with what the
    // later segments' queries passed back, and keeps the snapshot rows' gradients for the segments before.
    void backward_grads(const core::Tensor& dk_all,
                        const core::Tensor& dv_all,
                        const core::Tensor& d_k,
                        const core::Tensor& d_v);

    int64_t key_rows() const {
        return seg_.first + seg_.length - lo_;
    }
    int64_t prefix_rows() const {
        return seg_.first - lo_;
    }

   private:
    // The snapshot of rows [lo(first), first) of k, v rows [rows_first, ...) of a key range that starts at
    // range_lo: kept for segment `index` (in host memory with offload).
    void take_snapshot(const Tensor& keys, const Tensor& values, int64_t range_lo, int64_t first, int64_t index);

    int64_t heads_ = 0, dim_ = 0, batch_ = 0, lo_ = 0, window_ = 1;
    core::DType dtype_ = core::DType::f32;
    core::Device device_ = core::Device::cpu;
    bool offload_ = false;
    SegmentContext seg_;
    // Per segment, the keys and values of [lo_j, first_j) (host memory with offload), and the current segment's
    // on the device.
    std::vector<std::pair<core::Tensor, core::Tensor>> snapshots_;
    std::pair<core::Tensor, core::Tensor> snapshot_;
    // Backward: the gradients of rows [pending_lo_, pending_end_) that earlier segments own, from the later ones.
    core::Tensor pending_dk_, pending_dv_;
    int64_t pending_lo_ = 0, pending_end_ = 0;
};

}  // namespace mt::nn
