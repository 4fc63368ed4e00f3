// Muon (muon.md §1-2) over the parameter table's Muon group: momentum beside the master weights and the
// orthogonalised update of every whole matrix (ops::muon_step). The other parameters are AdamW's (optim/adamw.h,
// AdamWOptions::adamw_group_only). Which parameters are Muon's is the table's OptimGroup (set where each parameter
// is declared: every nn::Linear weight and the stacked expert matrices; embeddings, the LM head, norms, conv
// filters, biases and gate vectors stay AdamW's). A stack [E, A, B] (the experts) is E matrices, each
// orthogonalised on its own; a 2-D weight [A, B] one.
// Replicated (no `owned` list): every rank of a data-parallel group holds every matrix's momentum and runs its
// Newton-Schulz (the same result on each). Whole-matrix ownership (muon.md §3, parallel/muon_ownership.h): the
// optimizer holds momentum for, and updates, only the matrices this rank owns; GradSync hands it their reduced
// gradients and all-gathers the updated parameters.
#pragma once

#include <optional>
#include <vector>

#include "nn/param_table.h"
#include "nn/tensor_parallel.h"
#include "ops/muon.h"

namespace mt::optim {

// One matrix of a parameter: table index and its index in the stack [E, A, B] (0 for a 2-D weight).
struct MuonMatrixRef {
    int param = 0;
    int64_t index = 0;
    bool writer = true;  // this rank writes its momentum to checkpoints (a copy under capped ownership does not)
};

// How Muon is laid out over the job (the trainer's; the defaults: one process, every matrix).
struct MuonOptions {
    // The matrices this rank updates (nullopt: every matrix of the Muon group).
    std::optional<std::vector<MuonMatrixRef>> owned = std::nullopt;
    // The tensor-parallel group of this rank. A tp-split matrix is orthogonalised whole (muon.md §3, Megatron's
    // "duplicated" mode): each rank forms the direction of its slice (ops::muon_momentum), the group all-gathers the
    // slices in f32, every rank runs the same Newton-Schulz on the whole matrix and applies its own slice
    // (ops::muon_apply). Every rank of the group steps the same matrices in the same order (ownership is a function
    // of the layout, the same on each tp rank).
    nn::TensorParallel tp = {};
    // muon.per_head: a parameter with ParamSpec::head_rows is orthogonalised per head, each head's rows a matrix of
    // its own (muon.md §2); a head lies on one tp rank, so no gather.
    bool per_head = false;
    // Per table parameter, the phase (the gradient bucket) its matrices are staged in (stage()); empty: all phase 0.
    std::vector<int> phase_of_param = {};
};

class Muon {
   public:
    Muon(nn::ParamTable& table, const ops::MuonHyper& hyper, MuonOptions options = {});

    // What a step measured for the metrics (muon.md §8), over the matrices this rank updated: per table parameter
    // the squared norm of the change (0 for the others), and per matrix ||N||_F, Newton-Schulz's input.
    struct StepStats {
        std::vector<double> update_sq;
        std::vector<double> n_norm;
    };

    // One update with the given learning rate; grad_scale multiplies every gradient first (the loss scale's inverse:
    // Muon gradients are not clipped by the global norm, muon.md §5). update_sq as AdamW::step's; stats (optional)
    // is filled (it reads the momentum and gradients back: metrics steps only).
    void step(double lr, double grad_scale, const core::Tensor& update_sq = {}, StepStats* stats = nullptr);

    // The same step in phases, for the overlap of muon.md §3: stage(phase) runs the whole step (momentum,
    // Newton-Schulz, update) of the matrices of one phase (a gradient bucket whose reduction has landed) into side
    // buffers while the later buckets are still in flight; commit() writes every staged result into the parameters
    // and momentum once the trainer has accepted the step; discard() drops them (a skipped or re-run step leaves the
    // state untouched). The side buffers hold the staged matrices' parameters and momentum once more (f32) until
    // the commit. measure: record what commit's update_sq and stats report (the same for every stage of a step).
    void stage(int phase, double lr, double grad_scale, bool measure);
    void commit(const core::Tensor& update_sq = {}, StepStats* stats = nullptr);
    void discard();
    // Batches staged since the last commit or discard.
    int64_t staged_batches() const {
        return static_cast<int64_t>(pending_.size());
    }

    // The matrices held per parameter, in table order: the stack indices (ascending) and their momentum [k, A, B].
    struct Entry {
        int param = 0;
        std::vector<int64_t> matrices;
        std::vector<bool> writer;  // per matrix: this rank writes its momentum to checkpoints
        int64_t heads = 1;         // matrices Newton-Schulz sees per matrix (muon.per_head: the heads)
        core::Tensor momentum;
    };
    const std::vector<Entry>& entries() const {
        return entries_;
    }
    // The momentum of parameter `param`'s stack index `index`, [A, B] (a view; fails when not held here).
    core::Tensor momentum(int param, int64_t index = 0) const;
    int64_t state_bytes() const;
    const ops::MuonHyper& hyper() const {
        return hyper_;
    }

    // How the step batches the entries: each batch is one ops::muon_step call. Entries of fewer than
    // kAloneFrom matrices that share a shape, the decay flag and the phase (the 2-D weights of every layer) run
    // together on packed copies (one call instead of one per layer: the GPU's batched GEMMs fill the device); a
    // larger stack (the experts of a layer) runs alone, on views when its matrices are consecutive. Momentum of a
    // batch of several entries is one buffer, the entries' momentum views of it.
    static constexpr int64_t kAloneFrom = 8;
    struct Batch {
        std::vector<size_t> entries;  // into entries(), in table order
        int64_t matrices = 0;         // as Newton-Schulz sees them (a head under muon.per_head)
        core::Tensor momentum;        // [matrices, A, B]
        int tp_axis = -1;             // split over tp along this dimension of [A, B] (-1: whole on this rank)
        int64_t tp_replicas = 1;
        int phase = 0;      // MuonOptions::phase_of_param of its parameters
        int64_t first = 0;  // its first matrix in the per-matrix measures
    };
    const std::vector<Batch>& batches() const {
        return batches_;
    }

   private:
    static core::Tensor units(const Entry& e, const core::Tensor& t);
    // One batch's step (stage's body): in place on the parameters, or into side buffers (returned).
    struct Pending {
        size_t batch = 0;
        core::Tensor param = {}, copy = {}, momentum = {};  // the staged results (undefined in place)
    };
    Pending run_batch(size_t index, const ops::MuonHyper& h, double grad_scale, bool in_place);
    void stage_batches(int phase, double lr, double grad_scale, bool measure, bool in_place);
    // Copies between a batch's stack (its entries' matrices back to back) and the entries' tensors (which: 0 the
    // master weights, 1 the gradients, 2 the forward's copy).
    void pack(const Batch& b, const core::Tensor& stack, int which, bool into_stack) const;
    // One batch of tp-split matrices: the two halves around a gathered Newton-Schulz.
    void step_tp_split(const Batch& b,
                       const ops::MuonHyper& h,
                       double grad_scale,
                       const core::Tensor& m,
                       const core::Tensor& p,
                       const core::Tensor& g,
                       const core::Tensor& c,
                       const core::Tensor& change,
                       const core::Tensor& norms) const;

    nn::ParamTable* table_;
    nn::TensorParallel tp_;
    ops::MuonHyper hyper_;
    std::vector<Entry> entries_;
    std::vector<Batch> batches_;
    int64_t units_ = 0;             // matrices as Newton-Schulz sees them, over every batch
    std::vector<Pending> pending_;  // staged since the last commit
    core::Tensor change_, norms_;   // per matrix: the squared change and ||N|| of the staged steps
    bool measured_ = false;
};

// The runs of consecutive stack indices of a Muon entry (writers_only: of the matrices this rank writes, a copy under
// capped ownership writing none): fn(first stack index, count, first position in the entry's momentum).
template <typename Fn>
void for_each_matrix_run(const Muon::Entry& e, bool writers_only, Fn&& fn) {
    const auto n = static_cast<int64_t>(e.matrices.size());
    auto counts = [&](int64_t k) { return !writers_only || e.writer[static_cast<size_t>(k)]; };
    for (int64_t k = 0; k < n;) {
        if (!counts(k)) {
            ++k;
            continue;
        }
        int64_t end = k + 1;
        while (end < n && counts(end) &&
               e.matrices[static_cast<size_t>(end)] == e.matrices[static_cast<size_t>(end - 1)] + 1)
            ++end;
        fn(e.matrices[static_cast<size_t>(k)], end - k, k);
        k = end;
    }
}

// The [E, A, B] view of a Muon parameter (a 2-D weight is one matrix).
core::Tensor muon_matrices(const core::Tensor& t);

}  // namespace mt::optim
