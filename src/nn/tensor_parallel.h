// Tensor parallelism as the layers see it (docs/distributed.md, parallel.md §2). A layer built with a TensorParallel
// of size t holds its shard of every split weight (its heads, its part of the FFN's hidden dimension, its rows of
// the vocabulary) and computes on that shard alone; it never communicates. The collectives sit at the edges of the
// tensor-parallel regions, in the block and the model (Megatron's f and g operators):
//   region input:  without sequence parallelism the residual stream is whole on every rank and enters as it is;
//                  with it each rank holds n / t rows of the stream and the region's input is their all-gather.
//   region output: each rank's output is a part of the sum over tp: all-reduced into the whole stream, or with
//                  sequence parallelism reduce-scattered into this rank's rows.
// Their backwards swap the two: the gradient of an all-gather is a reduce-scatter and that of a reduce-scatter an
// all-gather. Under sequence parallelism rank r holds the rows [r n / t, (r + 1) n / t) of the micro-batch's B T
// token rows (the sequence when B = 1).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "nn/param_table.h"

namespace mt::parallel {
class Comm;
}

namespace mt::nn {

// Runtime state the trainer takes from the mesh (not a config key). size 1 (the default): nothing is split and
// nothing communicates.
struct TensorParallel {
    int64_t size = 1;
    int64_t rank = 0;
    bool sequence_parallel = false;
    parallel::Comm* comm = nullptr;       // host values (MPI): the loss's per-row statistics
    parallel::Comm* rows_comm = nullptr;  // the activations' memory (MPI on the CPU, NCCL on the GPU); null: comm

    bool active() const {
        return size > 1;
    }
    bool splits_rows() const {
        return active() && sequence_parallel;
    }
    // Rows of the residual stream this rank holds out of a micro-batch's n.
    int64_t stream_rows(int64_t n) const {
        return splits_rows() ? n / size : n;
    }
    // A split of n units (heads, hidden features, vocabulary rows) over the tp ranks: ceil(n / size) each, the last
    // shard padded when size does not divide n (only the vocabulary may be padded; the config refuses the rest).
    int64_t shard(int64_t n) const {
        return (n + size - 1) / size;
    }
    int64_t shard_first(int64_t n) const {
        return rank * shard(n);
    }
    parallel::Comm& rows() const;
};

// The spec of a parameter whose dimension `axis` (of its global shape `spec.shape`) is split over tp: this rank's
// shard. Unchanged when tp is off.
ParamSpec tp_split(ParamSpec spec, const TensorParallel& tp, int axis);
// A replicated parameter whose gradient each tp rank holds only a part of (summed over tp by the gradient reduction).
ParamSpec tp_partial(ParamSpec spec, const TensorParallel& tp);
// Split along `axis` into `parts` shards when tp is a multiple of parts larger than it (key/value heads fewer than the
// tp ranks, vLLM's rule): tp rank r holds shard r / (tp / parts), replicated on tp / parts ranks; else tp_split.
ParamSpec tp_split_replicated(ParamSpec spec, const TensorParallel& tp, int axis, int64_t parts);

// The region edges. n rows: the whole micro-batch's; `local` holds stream_rows(n).
// Region input: local [n / t, C] -> full [n, C] (sequence parallelism; otherwise a no-op: full is local).
void tp_gather_rows(const TensorParallel& tp, const core::Tensor& local, const core::Tensor& full);
// Region output: full [n, C], each rank's part of a sum -> local: the sum of this rank's rows (reduce-scatter), or
// without sequence parallelism the whole sum in place (local may be full).
void tp_sum_rows(const TensorParallel& tp, const core::Tensor& full, const core::Tensor& local);
// Token-local work each tp rank does on its own rows whatever the sequence parallelism (MoE under tp): the rank's
// share [r n / t, (r + 1) n / t) of the whole rows `full` (a view), and the all-gather of every rank's share.
core::Tensor tp_own_rows(const TensorParallel& tp, const core::Tensor& full);
void tp_gather_own_rows(const TensorParallel& tp, const core::Tensor& own, const core::Tensor& full);

}  // namespace mt::nn
