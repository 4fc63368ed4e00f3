// The keys and values a softmax attention layer carries across sequence segments (long_context.md §4), and their
// gradients: the K/V of every position of the sequence (after RoPE), which each segment's queries read from the
// layer's first visible position lo (0, or a window's reach) up to their own, and the accumulators where a segment's
// backward adds the gradients of the earlier positions' keys and values, which the segment owning them adds to its
// own (the backward runs the segments last first).
//
// With long.offload_kv the cache and the accumulators live in pinned host memory. A pass stages on the device only
// the rows [lo, end of the segment) of the layer it runs, on the side lane (core/exec.h), one attention layer ahead:
// a layer's forward prefetches the next attention layer's keys, its backward the previous one's keys and
// accumulators, so the copies overlap the compute; the updated accumulator rows go back to the host after its
// backward. The device holds the staging of two layers at most instead of every layer's cache.
#pragma once

#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/segments.h"

namespace mt::nn {

class SegmentKv {
   public:
    void configure(int64_t kv_heads, int64_t head_dim, core::DType dtype, core::Device device, bool offload);
    // The segment the next forward and backward run; lo: the first position its queries may see. The first
    // segment's first forward starts a new sequence (the accumulators restart at zero).
    void begin(const SegmentContext& seg, int64_t batch, int64_t lo);
    // No segments: frees the cache, the accumulators and any staging.
    void clear();
    // The model's pass: forward (false) or backward (true, where a forward is a recompute's re-run).
    void set_backward_phase(bool on) {
        backward_phase_ = on;
    }
    // Offload: the attention layers before and after this one (forward order), for the prefetch.
    void link(SegmentKv* next, SegmentKv* prev) {
        next_ = next;
        prev_ = prev;
    }

    // Forward: the segment's own keys and values k, v [B, T, Hkv, D] join the cache; returns K, V [B, Tk, Hkv, D]
    // over [lo, first + T), for attention_fwd. forward_done: the forward no longer needs them.
    std::pair<core::Tensor, core::Tensor> forward_keys(const core::Tensor& k, const core::Tensor& v);
    void forward_done();
    // Backward: K, V over [lo, first + T) for attention_bwd. backward_grads takes its dK, dV over the same rows,
    // writes (=) the segment's own d_k, d_v [B, T, Hkv, D] (with what later segments accumulated) and adds the rest
    // into the accumulators.
    std::pair<core::Tensor, core::Tensor> backward_keys();
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
    // Offload: issue the copies of this segment's rows to the device on the side lane (the keys before the
    // segment; with backward, all its keys and the accumulator rows), unless staged already; wait_staged also makes
    // the main lane wait for them.
    void prefetch(bool backward);
    void wait_staged(bool backward);
    void release_staged();
    bool staged_for(bool backward) const {
        return stage_generation_ == generation_ && stage_index_ == seg_.index && (!backward || stage_backward_);
    }
    core::Tensor device_rows(int64_t rows) const;
    // Offload: the host accumulator rows [lo, hi) hold this sequence's sums from now on.
    void add_written(int64_t lo, int64_t hi);

    int64_t heads_ = 0, dim_ = 0, batch_ = 0, lo_ = 0;
    core::DType dtype_ = core::DType::f32;
    core::Device device_ = core::Device::cpu;
    bool offload_ = false, backward_phase_ = false;
    SegmentContext seg_;
    SegmentKv *next_ = nullptr, *prev_ = nullptr;
    core::Tensor k_, v_, dk_, dv_;  // [B, total, Hkv, D]: on the device, or pinned host memory with offload
    // Offload staging: K, V [B, Tk, Hkv, D] and (backward) dK, dV accumulator rows, of segment stage_index_ of
    // sequence stage_generation_.
    core::Tensor sk_, sv_, sdk_, sdv_;
    int64_t generation_ = 0, stage_generation_ = -1, stage_index_ = -1;
    bool stage_backward_ = false;
    std::vector<std::pair<int64_t, int64_t>> written_;  // offload: merged row ranges written since begin()
};

}  // namespace mt::nn
