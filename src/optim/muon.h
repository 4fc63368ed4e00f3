// Muon (muon.md §1-2) over the parameter table's Muon group: momentum beside the master weights and the
// orthogonalised update of every whole matrix (ops::muon_step). The other parameters are AdamW's (optim/adamw.h,
// AdamWOptions::adamw_group_only). Which parameters are Muon's is the table's OptimGroup (set where each parameter
// is declared: every nn::Linear weight and the stacked expert matrices; embeddings, the LM head, norms, conv
// filters, biases and gate vectors stay AdamW's). A stack [E, A, B] (the experts) is E matrices, each
// orthogonalised on its own; a 2-D weight [A, B] one.
// Replicated: every rank of a data-parallel group holds every matrix's momentum and runs its Newton-Schulz (the same
// result on each). Whole-matrix ownership (one owner per matrix, reduce-to-owner, all-gather of the update: muon.md
// §3) is the Muon issue's next step; the trainer refuses Muon with ZeRO-1, tensor parallelism or a GPU until then.
#pragma once

#include <vector>

#include "nn/param_table.h"
#include "ops/muon.h"

namespace mt::optim {

class Muon {
   public:
    Muon(nn::ParamTable& table, const ops::MuonHyper& hyper);

    // One update with the given learning rate; grad_scale multiplies every gradient first (the loss scale's inverse:
    // Muon gradients are not clipped by the global norm, muon.md §5). update_sq as AdamW::step's.
    void step(double lr, double grad_scale, const core::Tensor& update_sq = {});

    // The Muon group's parameters (table indices, in table order) and each one's momentum (the parameter's shape).
    const std::vector<int>& params() const {
        return params_;
    }
    core::Tensor momentum(int param) const;
    int64_t state_bytes() const;
    const ops::MuonHyper& hyper() const {
        return hyper_;
    }

   private:
    nn::ParamTable* table_;
    ops::MuonHyper hyper_;
    std::vector<int> params_;
    std::vector<core::Tensor> momentum_;  // per entry of params_
};

// The [E, A, B] view of a Muon parameter (a 2-D weight is one matrix).
core::Tensor muon_matrices(const core::Tensor& t);

}  // namespace mt::optim
