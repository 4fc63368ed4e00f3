// Data-parallel gradient reduction and the ZeRO-1 layout (docs/distributed.md). The gradient arena is cut into
// buckets, each a run of consecutive parameters replicated over the same ranks: dense parameters over dp_span (every
// rank that sees different tokens), expert-sharded ones over edp (the ranks holding the same experts), and those each
// tensor-parallel rank holds a part of the gradient of (norm gains under sequence parallelism) over stage (dp_span x
// tp). Buckets are
// planned from the end of the arena, because the backward completes the last parameters first, and each is issued
// as soon as the backward reports its parameters complete (grads_ready), so the reduction overlaps the rest of the
// backward. Replicated optimizer: each bucket is all-reduced. ZeRO-1: each bucket is reduce-scattered, rank r of
// its group owning the r-th of |group| equal slices (the arena alignment makes every bucket divisible), the
// optimizer updates only the owned slices, and gather_params() all-gathers the updated parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/compressed_reduce.h"
#include "parallel/mesh.h"
#include "parallel/muon_ownership.h"

namespace mt::parallel {

// One parameter's place in the arenas: its elements [begin, begin + numel) and its padded end (the next
// parameter's begin), whether it is expert-sharded (reduced over edp), tp-partial (reduced over stage; else over
// dp_span), and whether tp splits it (each tp rank holds a different part: the gradient norm counts every part).
struct ArenaParam {
    int64_t begin = 0, numel = 0, end = 0;
    bool expert = false;
    bool tp_partial = false;
    bool tp_split = false;
    bool pipeline_tied = false;  // a tied embedding's copy: the first and the last pipeline stage hold one each
    int64_t tp_replicas = 1;     // a tp shard held by this many tp ranks (replicated key/value heads)
    // Muon under ZeRO-1 (muon.md §3): the parameter is a stack of whole [matrix_rows, matrix_cols] matrices, each
    // owned by one rank of its group (parallel/muon_ownership.h); 0: element-sharded.
    int64_t matrix_rows = 0, matrix_cols = 0;
};

// A bucket's place: parameters [lowest, next bucket's lowest) of the arena order, arena elements [begin, end), and
// its reduction group (edp when expert, stage when tp_partial, else dp_span).
struct GradBucketRange {
    int lowest = 0;
    int64_t begin = 0, end = 0;
    bool expert = false;
    bool tp_partial = false;
};

// How buckets are cut. A bucket holding Muon matrices (ArenaParam::matrix_rows) grows to muon_bucket_mb and on
// until it holds at least min_matrices (2 R for a group of R ranks, muon.md §3: every owner gets work).
struct BucketLimits {
    double bucket_mb = 25.0;
    double muon_bucket_mb = 64.0;
    int64_t min_matrices_dense = 0, min_matrices_expert = 0;
};

// GradSync's bucket plan, a pure function (the memory planner and tests use it without a mesh): from the end of the
// arena (the backward completes the last parameters first), runs of whole consecutive parameters of one reduction
// group up to bucket_mb MiB of elem_bytes elements (a larger parameter is a bucket of its own), in issue order.
std::vector<GradBucketRange> grad_sync_buckets(const std::vector<ArenaParam>& params,
                                               int64_t elem_bytes,
                                               const BucketLimits& limits);
inline std::vector<GradBucketRange> grad_sync_buckets(const std::vector<ArenaParam>& params,
                                                      int64_t elem_bytes,
                                                      double bucket_mb) {
    return grad_sync_buckets(params, elem_bytes, BucketLimits{.bucket_mb = bucket_mb});
}

// The flat arenas GradSync reduces and gathers, described without the model: the parameters in arena order and the
// three arenas of one layout (weights is what the forward reads, master what the optimizer updates; without a
// master copy, under f32 training, they are the same tensor).
struct GradArenas {
    std::vector<ArenaParam> params;
    core::Tensor grads, weights, master;
    bool master_copy = false;
};

struct GradSyncOptions {
    double bucket_mb = 25.0;
    bool zero = false;  // ZeRO-1 (only with more than one data-parallel rank)
    // Whole-matrix ownership (ZeRO-1 with parameters whose ArenaParam::matrix_rows is set: Muon's): the buckets
    // holding matrices grow to muon_bucket_mb and 2 R matrices, and at most max_owner_group ranks of a group own
    // matrices (0: all), each further rank a copy of one of them (muon.md §3 "Too few matrices").
    double muon_bucket_mb = 64.0;
    int64_t max_owner_group = 0;
    // Gradient compression of the packed buckets' matrices (muon.md §6; level 0: off), from step warmup_steps on.
    optim::CompressOptions compress{.level = 0};
    int64_t compress_warmup_steps = 1000;
    // Debug (ZeRO-1): gather_params first fills every element of the gathered arena this rank does not own with NaN
    // (muon.md §9 test 5: a forward that read a bucket before its gather landed would see it).
    bool poison_gathers = false;
};

// What compression did in the last step, summed over this rank's packed buckets (0 while off or warming up).
struct CompressReport {
    optim::CompressStats stats;
    int64_t wire_bytes = 0, raw_bytes = 0;  // bytes this rank sent, and the same exchange uncompressed
};

// The ownership balance GradSync logs at startup (muon.md §3): per owner position the Newton-Schulz FLOPs per
// iteration of its matrices, and per packed bucket its padding.
struct OwnershipReport {
    std::vector<double> dense_cost, expert_cost;
    struct Bucket {
        bool expert = false;
        int64_t matrices = 0, payload = 0, padding = 0;
    };
    std::vector<Bucket> buckets;
};

class GradSync {
   public:
    // Every parameter must start at a multiple of the dp_span, edp and stage group sizes (the arena alignment). The
    // buckets move over dense_rows / expert_rows / stage_rows (communicators over the dp_span, edp and stage ranks for
    // the gradients' memory: NCCL for GPU tensors; nullptr: the mesh's MPI groups); scalars go over the mesh's groups.
    // Under ZeRO-1 a bucket holding whole-owned matrices is packed (parallel/muon_ownership.h): its gradients are
    // copied into per-rank blocks for the reduce-scatter and the updated parameters copied back out of the gathered
    // blocks.
    GradSync(GradArenas arenas,
             const Mesh& mesh,
             const GradSyncOptions& options,
             Comm* dense_rows = nullptr,
             Comm* expert_rows = nullptr,
             Comm* stage_rows = nullptr);

    // True when gradients must be reduced at all (more than one rank sees different tokens).
    bool active() const {
        return active_;
    }
    bool zero() const {
        return zero_;
    }
    int64_t num_buckets() const {
        return static_cast<int64_t>(buckets_.size());
    }
    // Buckets of the last step that were issued from grads_ready, i.e. while the backward was still running.
    int64_t buckets_overlapped() const {
        return overlapped_;
    }
    // The backward's hook: every parameter with index >= first has its final gradient. Issues the buckets
    // that became complete and polls the pending ones (MPI progresses nonblocking collectives inside its calls).
    void grads_ready(int first);
    // Issues the buckets not issued yet and waits for all; afterwards every rank holds the reduced gradients (all of
    // them, or under ZeRO-1 its owned slices). Returns the seconds spent here (the part not overlapped) less the time
    // in on_reduced, which (when given) is called with each bucket's index as soon as that bucket's gradients are
    // reduced and in place, in issue order, while the later buckets are still in flight (Muon's overlap: the owner
    // step of a bucket's matrices runs then, muon.md §3).
    double finish(const std::function<void(int bucket)>& on_reduced = {});
    // Per parameter (table order), the index of the bucket holding it (issue order), the phase of
    // optim::MuonOptions::phase_of_param.
    std::vector<int> bucket_of_params() const;
    // The L2 norm of the reduced gradient over the whole model (collective over the world: each rank sums the squares
    // of what it holds, each divided by the number of ranks holding the same elements) and, from the same pass over
    // the gradient (one device synchronisation, one all-reduce), the squared norms of groups of parameters as
    // group_norms_sq(group_of, groups, true) gives them: the metrics' per-layer gradient norms at no extra pass.
    struct GradNorms {
        double norm = 0.0;
        std::vector<double> group_sq;
    };
    GradNorms grad_norms(const std::vector<int>& group_of, int groups) const;
    // The squared L2 norms of groups of parameters, of the reduced gradient (grads) or of the master weights, summed
    // over the whole model as grad_norms sums (collective over the world: one all-reduce of the vector).
    // group_of[i]: parameter i's group in [0, groups), or -1 for none. Under ZeRO-1 with mixed precision the master
    // weights are read in the owned slices, which are current between the update and a checkpoint's gather.
    std::vector<double> group_norms_sq(const std::vector<int>& group_of, int groups, bool grads) const;
    // The local half of group_norms_sq for sums the caller measured itself over the elements this rank updates
    // (the whole parameter, or under ZeRO-1 its owned slices; e.g. the squared norm of the optimizer's change):
    // per_param[i] divided by the number of ranks holding the same elements and added to group_of[i]'s entry.
    // The sum of the result over the world (the caller's all-reduce) counts every element once. No communication.
    std::vector<double> group_sums(const std::vector<double>& per_param,
                                   const std::vector<int>& group_of,
                                   int groups) const;
    // ZeRO-1: this rank's arena ranges, one slice per bucket, ascending (the whole arena when inactive), and of
    // them the element-sharded ones (without the whole-owned matrices: AdamW's).
    const std::vector<optim::ArenaRange>& owned() const {
        return owned_;
    }
    const std::vector<optim::ArenaRange>& owned_flat() const {
        return owned_flat_;
    }
    // Whole-matrix ownership: the matrices this rank updates (table order), and every rank's assignment.
    bool owns_matrices() const {
        return owns_matrices_;
    }
    const std::vector<OwnedMatrix>& owned_matrices() const {
        return owned_matrices_;
    }
    const OwnershipReport& ownership_report() const {
        return report_;
    }
    // The optimizer step the next reduction belongs to (compression's warm-up and random streams).
    void set_step(int64_t step) {
        step_ = step;
    }
    bool compressing() const {
        return compress_warmup_ >= 0 && step_ >= compress_warmup_;
    }
    CompressReport compress_report() const;
    // The compression state of every packed bucket (error buffers, EF21 estimates) for checkpoints, and its reset.
    std::vector<CompressedReduce::State> compress_states();
    void reset_compress_states();
    // ZeRO-1: starts all-gathering every bucket's updated parameters over its group: the weights the forward reads
    // (under mixed precision the bf16 copy; the f32 master weights then stay sharded until gather_master). The
    // gathers complete in the background: params_needed or settle_params before anything reads those weights.
    void gather_params();
    // The next forward is about to read the parameters with index < end: later GPU work waits for their
    // gathers (a host wait on the MPI backend). The model's forward calls it through Model's hook.
    void params_needed(int end);
    // Waits on the host for every pending parameter gather (before evaluation, checkpoints, direct reads).
    void settle_params();
    // Before a checkpoint writes the parameters: settles the pending gathers and, under ZeRO-1 with mixed
    // precision, all-gathers the f32 master weights when other ranks' slices are stale. Collective over the same
    // groups; a no-op when everything is whole.
    void gather_master();
    // A checkpoint was just loaded into every rank's whole master arena: nothing to gather before the next save.
    void master_loaded() {
        master_stale_ = false;
    }

   private:
    struct Bucket {
        int lowest = 0;              // smallest parameter index in the bucket
        int64_t begin = 0, end = 0;  // arena range
        bool expert = false;         // reduced over edp
        bool tp_partial = false;     // reduced over stage (else, not expert, over dp_span)
        int64_t share = 0;           // elements per rank of the group: (end - begin) / |group|
        int64_t mine = 0;            // this rank's slice [mine, mine + share) of the arena
        int64_t staging = 0;         // ZeRO-1: offset of the bucket's owned slice in staging_
        bool issued = false;
        CommWork work;          // the gradient reduction
        CommWork param_gather;  // ZeRO-1: the parameter gather after the step
        // The arena ranges this rank holds the reduced gradient of, each with the divisor copies() takes (the group
        // size, or the owner positions of a whole-owned matrix).
        struct Held {
            int64_t begin = 0, end = 0, group = 1;
        };
        std::vector<Held> held;
        // Packed (whole-owned matrices inside): per group rank, its ranges in block order; `share` is the block.
        std::vector<std::vector<optim::ArenaRange>> blocks;
        int64_t positions = 1;      // owner positions of its matrices
        core::Tensor send;          // the gradient blocks of the reduce-scatter in flight
        core::Tensor gathered;      // the parameter blocks of the all-gather in flight
        core::Tensor gather_arena;  // where gathered's blocks go once the gather completes (undefined: nowhere)
        std::shared_ptr<CompressedReduce> compress;  // compress.level > 0: its compressed reduction
        bool compressed = false;                     // the reduction in flight is compress's
    };
    Comm& group(const Bucket& b) const {
        return b.expert ? *edp_rows_ : b.tp_partial ? *stage_rows_ : *dense_rows_;
    }
    // How many ranks of the job hold the same reduced gradient element as this rank, in a bucket of group size
    // `group` (1 when a replicated optimizer holds the whole bucket: replicas over the group count too).
    double copies(const ArenaParam& p, int64_t group) const;
    std::map<std::pair<int, double>, std::vector<core::Tensor>> held_parts(const core::Tensor& arena,
                                                                           const std::vector<int>& group_of,
                                                                           int groups,
                                                                           bool ungrouped) const;
    void issue(Bucket& b);
    CommWork start_gather(Bucket& b, const core::Tensor& arena);
    // parallel.poison_gathers: NaN into every gathered element this rank does not own.
    void poison_unowned(const core::Tensor& arena) const;
    // A packed bucket's gather completed: the other ranks' blocks into the arena.
    void unpack_gathered(Bucket& b);
    void plan_packed(const GradSyncOptions& options);

    GradArenas arenas_;
    Comm *dense_, *world_;                        // host scalars (MPI)
    Comm *dense_rows_, *edp_rows_, *stage_rows_;  // the buckets
    int64_t tp_size_ = 1, edp_size_ = 1, stage_size_ = 1;
    bool zero_, active_;
    bool master_stale_ = false;    // ZeRO-1: only the owned slices of the master weights are current
    std::vector<Bucket> buckets_;  // in issue order (the end of the arena first)
    std::vector<optim::ArenaRange> owned_, owned_flat_;
    bool owns_matrices_ = false;
    int64_t step_ = 0, compress_warmup_ = -1;  // -1: no compression
    bool poison_gathers_ = false;
    std::vector<OwnedMatrix> owned_matrices_;
    OwnershipReport report_;
    int64_t overlapped_ = 0, issued_early_ = 0;
    core::Tensor staging_;  // ZeRO-1: the owned slices of the reduce-scatter outputs
};

}  // namespace mt::parallel
