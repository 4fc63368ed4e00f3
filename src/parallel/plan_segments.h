// The memory planner's picture of sequence segments (long_context.md §4, nn/segments.h): where the boundaries of a
// row fall (the model's own rule), what crosses them and stays all step (the global attention layers' key/value
// caches and dK/dV accumulators, the window layers' snapshots of the w - 1 rows before each segment, KDA's kept start
// states and conv halos, the row's per-token losses), on the device or, with long.offload_kv, in pinned host memory,
// and one segment's activations (the model resizes its buffers per segment). What a segment's passes add to their
// phases (the attention backward's dK, dV over every key the segment sees, offload's staged key rows) is simulated
// in plan_memory.cpp on the key rows given here. It follows nn/model.cpp (forward, begin_pass),
// nn/layers/segment_kv.cpp, window_kv.cpp and kda_layer.cpp (set_segment, keep_for_next_segment, backward) by hand:
// tests/parallel/plan_segments_test.cpp holds it to a real segmented model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model_config.h"
#include "nn/precision.h"
#include "parallel/plan_buffers.h"

namespace mt::parallel {

// Where a segment buffer lives: the run's device, pinned host memory (long.offload_kv), or ordinary host memory.
enum class SegmentWhere : uint8_t { device, pinned, host };

// `count` allocations of `each` bytes (summed over the layers), held from the step's first segment on.
struct PlanSegmentBuffer {
    std::string name;  // "attention.kv_cache", ...
    PlanKind kind = PlanKind::attention;
    int64_t each = 0, count = 0;
    SegmentWhere where = SegmentWhere::device;
    // Allocated by the backward of a segment after the first and freed by the first's: not there after a step.
    bool backward_only = false;
    int64_t bytes() const {
        return each * count;
    }
};

struct PlanSegments {
    std::vector<int64_t> bounds;  // [0, b_1, ..., T]: what Model::segment_bounds() says after a forward of this row
    bool offload = false;         // long.offload_kv
    std::vector<PlanSegmentBuffer> held;
    int64_t count() const {
        return static_cast<int64_t>(bounds.size()) - 1;
    }
    int64_t first(int64_t j) const {
        return bounds[static_cast<size_t>(j)];
    }
    int64_t length(int64_t j) const {
        return bounds[static_cast<size_t>(j) + 1] - bounds[static_cast<size_t>(j)];
    }
    int64_t longest() const;
};

// The boundaries of a row of seq tokens under cfg.segments, as Model::plan_segments draws them ({0, seq} without
// segments).
std::vector<int64_t> plan_segment_bounds(const nn::ModelConfig& cfg, int64_t seq);

// The segments of a batch x seq micro-batch and the buffers they hold beside one segment's activations (none
// without segments).
PlanSegments plan_segments(const nn::ModelConfig& cfg, const nn::Precision& precision, int64_t batch, int64_t seq);

// Per block, the rows [lo, first + length) of the key/value cache that its attention reads in segment j (lo: 0, or
// a window layer's reach); 0 for a KDA block.
std::vector<int64_t> plan_segment_key_rows(const nn::ModelConfig& cfg, const PlanSegments& segments, int64_t j);

// The activations while segment j runs: plan_activations at its length, KDA's halo'd conv buffers (segments after
// the first) as the scratch of its forward and backward, and the workspace slots at the longest segment's (the
// slots only grow; d_norm and d_tmp follow the segment).
PlanActivations plan_segment_activations(const nn::ModelConfig& cfg,
                                         const nn::Precision& precision,
                                         int64_t batch,
                                         const PlanSegments& segments,
                                         int64_t j,
                                         int64_t ep_size,
                                         bool deterministic);

}  // namespace mt::parallel
