// Context parallelism as the layers see it (long_context.md §7, docs/distributed.md "Context parallelism"). The cp
// ranks of a group share every micro-batch and split its sequence in the zigzag layout (parallel/context_parallel.h):
// rank r holds the tokens of chunks r and 2 cp - 1 - r of every row, [B, 2c] of the [B, T] batch. Token-local layers
// (embedding, norms, MLP, MoE, AttnRes mixes, the LM head) run on those rows as on any others; the token mixers
// communicate: softmax attention gathers keys and values over the group (nn/layers/cp_attention.h), KDA passes its
// state and its short conv's halo between the spans (nn/layers/kda_cp.h). The trainer sums the dense gradients over
// cp with the data-parallel ranks', and the model sums the loss over the group.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"
#include "nn/enum_names.h"
#include "parallel/context_parallel.h"

namespace mt::parallel {
class Comm;
}

namespace mt::nn {

// cp.attn: how a softmax layer sees the keys of the other ranks. allgather: every rank gathers all keys and values
// and reduce-scatters their gradients (the Llama 3 scheme); ring: the key/value shards travel around the ring while
// each step's partial result is merged by log-sum-exp.
enum class CpAttnMode { allgather, ring };
// cp.kda: how a KDA layer's state crosses the spans. affine: every span scans from the zero state, the spans' affine
// maps (M, h) are all-gathered and folded, and each span reruns from its true start state (LASP-2); relay: the state
// passes span to span in global order (serial; the oracle the tests hold affine against).
enum class CpKdaMode { affine, relay };

template <>
struct EnumNames<CpAttnMode> {
    static constexpr std::array<std::pair<CpAttnMode, const char*>, 2> names = {
        {{CpAttnMode::allgather, "allgather"}, {CpAttnMode::ring, "ring"}}};
};

template <>
struct EnumNames<CpKdaMode> {
    static constexpr std::array<std::pair<CpKdaMode, const char*>, 2> names = {
        {{CpKdaMode::affine, "affine"}, {CpKdaMode::relay, "relay"}}};
};

// Runtime state the trainer takes from the mesh (the modes are config keys). size 1 (the default): nothing is split.
struct ContextParallel {
    int64_t size = 1;
    int64_t rank = 0;
    CpAttnMode attn = CpAttnMode::allgather;
    CpKdaMode kda = CpKdaMode::affine;
    parallel::Comm* comm = nullptr;  // the cp group; host tensors (MPI)

    bool active() const {
        return size > 1;
    }
    // The layout of a sequence of `seq` tokens (a multiple of 2 size).
    parallel::Zigzag layout(int64_t seq) const {
        return parallel::zigzag(size, rank, seq);
    }
    parallel::Comm& group() const;
};

// What a context-parallel forward (and its backward) runs on: the length of the sequence it splits and, under
// document masking, the [B, T] i32 document-start map of the whole row on the host (nn/documents.h), undefined
// otherwise. With sequence segments (long_context.md §4) the split sequence is one segment, positions [first, first +
// total) of a row of T tokens, and the segment is what the zigzag cuts (every segment its own 2 cp chunks).
struct CpBatch {
    int64_t total = 0;
    int64_t first = 0;
    core::Tensor host_doc_start;
    // Whether the first chunk continues a state from the segment before (segments after the first).
    bool continues() const {
        return first > 0;
    }
    // Columns [lo, hi) of the document map, in the split sequence's positions (doc_map_from: relative to lo).
    core::Tensor doc_map(int64_t lo, int64_t hi, core::Device device) const;
    // Whether the token at position `pos` of the split sequence starts a document in row b (the map must be defined).
    bool starts_document(int64_t b, int64_t pos) const;
};

// Rows along the time axis (dim 1) of [B, T, ...] tensors, contiguous, host memory:
// this rank's two chunks of `whole` [B, T, ...] into `local` [B, T / size, ...];
void cp_local_rows(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local);
// every rank's `local` rows into their places in `whole` (an all-gather over the group);
void cp_gather_rows(const ContextParallel& cp, const core::Tensor& local, const core::Tensor& whole);
// each rank holding a part of a sum over `whole`: this rank's rows of the sum into `local` (a reduce-scatter).
void cp_reduce_scatter_rows(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local);
// The `before` rows of the sequence that precede each of this rank's spans (a sliding window's reach), fetched point to
// point from the ranks that hold them; every rank of the group calls it together. Returns, per span s, [B, h_s, ...]
// with h_s = min(before, span_first(s)) (the rows [span_first(s) - h_s, span_first(s)); undefined when h_s = 0). The
// rows may lie in several chunks of several ranks (before > the chunk), this rank's own included.
std::array<core::Tensor, 2> cp_rows_before(const ContextParallel& cp,
                                           int64_t total,
                                           const core::Tensor& local,
                                           int64_t before);
// The backward of cp_rows_before: each span's halo gradient `dhalo[s]` (the shapes cp_rows_before returned) goes back
// to the rows' owners and adds (+=) into their `dlocal` [B, T / size, ...]. Collective as the forward.
void cp_add_rows_before(const ContextParallel& cp,
                        int64_t total,
                        const std::array<core::Tensor, 2>& dhalo,
                        const core::Tensor& dlocal,
                        int64_t before);
// This rank's rows of `whole` [B, T, ...] as a new host tensor.
core::Tensor cp_local(const ContextParallel& cp, const core::Tensor& whole);
// The global positions of this rank's tokens, [B, T / size] i32 on the host: the rows of `positions` [B, total] (the
// position of each token in its document, under document masking), or when undefined the plain positions in the
// sequence, which starts at position `first` of the row (a segment's).
core::Tensor cp_local_positions(
    const ContextParallel& cp, const core::Tensor& positions, int64_t batch, int64_t total, int64_t first = 0);

}  // namespace mt::nn
