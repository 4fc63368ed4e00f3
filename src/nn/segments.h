// Sequence segments (long_context.md §4): a [B, T] batch runs as J segments of consecutive positions, in order in
// the forward and in reverse in the backward, with exact gradients. The model (nn/model.cpp) drives the loop; each
// token mixer carries what crosses a boundary: softmax attention the keys and values of earlier positions (and
// accumulates their gradients), KDA its state and its short conv's last W - 1 input rows (the halo). Everything else
// is token-wise. This file holds what they share: the segment boundaries, the context a pass runs in, and row copies
// along the time axis.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

struct ModelConfig;

// How a sequence is split (`long.segments`, `long.segment_tokens`). One segment: the plain single pass.
struct SegmentConfig {
    int64_t count = 1;   // J: split into this many segments of about equal estimated compute
    int64_t tokens = 0;  // > 0: segments of this many tokens (the last may be shorter); wins over count
    // Explicit boundaries 0 < b_1 < ... < b_{J-1} < T (API and tests: uneven and mid-chunk splits); wins over both.
    std::vector<int64_t> bounds;
    // long.offload_kv: the attention layers' key/value caches and their gradient accumulators, and KDA's saved
    // segment states, in pinned host memory, staged on the device one layer ahead (nn/layers/segment_kv.h).
    bool offload_kv = false;
    bool enabled() const {
        return count > 1 || tokens > 0 || !bounds.empty();
    }
};

// The boundaries [0, b_1, ..., b_{J-1}, T] of a sequence of `seq` tokens. With count, the cut points split the
// estimated cost a t + b t^2 / 2 up to position t (linear: per-token FLOPs of everything but causal attention,
// per_key: FLOPs per query and key of the causal layers) into equal parts, each rounded to a multiple of `granule`
// (the KDA chunk); duplicate points merge, so a short sequence gets fewer segments.
std::vector<int64_t> segment_bounds(
    const SegmentConfig& cfg, int64_t seq, int64_t granule, double linear, double per_key);

// The segment a forward (and the backward after it) runs: positions [first, first + length) of every row, of a
// sequence of `total`. count == 1: no segments (the layers keep no caches).
struct SegmentContext {
    int64_t index = 0, count = 1;
    int64_t first = 0, length = 0, total = 0;
    // The backward's re-run of this segment's forward: the caches it filled the first time are read, not refilled.
    bool recompute = false;
    // [B, total] i32 on the host: the whole sequence's document-start map (nn/documents.h), or undefined.
    core::Tensor host_doc_start;
    bool active() const {
        return count > 1;
    }
};

// Columns [lo, hi) of a [B, T] i32 host map, each entry minus `lo` and clamped at 0 (a document that started
// before lo starts at 0), on `device`: the map of a key range that begins at position lo.
core::Tensor doc_map_from(const core::Tensor& host_map, int64_t lo, int64_t hi, core::Device device);

// Rows along the time axis (dim 1) of [B, T, ...] tensors: dst[b, dst_first + i] = src[b, src_first + i] (copy) or
// += (add), i < count. Both contiguous, same dtype and device, the same trailing shape.
void copy_time_rows(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count);
void add_time_rows(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count);
// The same copy queued on the current lane (core/exec.h) between a device tensor and a pinned host one
// (Tensor::zeros_pinned), returning at once (Backend::copy_async; the CPU copies now).
void copy_time_rows_async(
    const core::Tensor& dst, int64_t dst_first, const core::Tensor& src, int64_t src_first, int64_t count);
// What a segment keeps for a later pass (a KDA state, a window snapshot): with offload a copy in pinned host memory,
// else t itself; and such a kept tensor back on `device` for the pass that reads it (t itself when there already).
// Undefined stays undefined.
core::Tensor keep_for_later(const core::Tensor& t, bool offload);
core::Tensor on_device(const core::Tensor& t, core::Device device);
// src[:, first:first + count] as a contiguous tensor: a view when B = 1, else a copy.
core::Tensor time_rows(const core::Tensor& src, int64_t first, int64_t count);

}  // namespace mt::nn
