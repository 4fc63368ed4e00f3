// Pipeline parallelism's pure parts (docs/distributed.md "Pipeline parallelism", parallel.md §3): the split of the
// layers into chunks, and the order in which one pipeline rank runs the forwards and backwards of the step's
// micro-batches (1F1B, and Megatron-LM's interleaved schedule over virtual stages). No communication here.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::parallel {

// The forward or backward of micro-batch `micro` through this rank's model chunk `chunk` (0 .. virtual stages - 1;
// the model-order chunk is chunk * stages + stage).
struct PipeOp {
    bool forward = true;
    int64_t chunk = 0;
    int64_t micro = 0;
    bool operator==(const PipeOp&) const = default;
};

// The ops of rank `stage` of `stages`, over `micros` micro-batches, in order. virtual_stages = 1: 1F1B (stages -
// stage - 1 warm-up forwards, then one forward and one backward alternately, then the remaining backwards).
// virtual_stages > 1: the interleaved schedule (micros a multiple of stages): forwards walk the chunks in groups of
// `stages` micro-batches, backwards the chunks in reverse, with (stages - stage - 1) * 2 + (v - 1) * stages warm-up
// forwards. Every rank runs every (chunk, micro) forward and backward once.
std::vector<PipeOp> pipeline_schedule(int64_t stages, int64_t stage, int64_t virtual_stages, int64_t micros);

// The idle fraction of an ideal pipeline step: (p - 1) / (v m + p - 1).
double pipeline_bubble(int64_t stages, int64_t virtual_stages, int64_t micros);

// Contiguous chunks of layers minimising the largest chunk's cost: layer_cost[l] per layer, first_extra added to the
// first chunk (the embedding) and last_extra to the last (the final norm, LM head and loss). Every chunk gets at
// least one layer. Returns the layers per chunk.
std::vector<int64_t> pipeline_split(const std::vector<double>& layer_cost,
                                    double first_extra,
                                    double last_extra,
                                    int64_t chunks);

}  // namespace mt::parallel
