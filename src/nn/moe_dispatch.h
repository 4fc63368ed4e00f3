// Expert-parallel dispatch and combine (moe.md §3): the rows a rank routed, sorted by global expert, go by one
// all-to-all to the ranks that hold those experts, and the experts' outputs come back by the inverse all-to-all.
// Rank r of the ep group holds experts [r El, (r + 1) El), El = E / ep. A rank receives its rows grouped by source
// rank ([src][local expert][row]) and reorders them to [local expert][src][row], so that each local expert's rows
// are contiguous for the grouped GEMMs; the reverse path undoes both steps. The plan (counts and the reorder) is
// built once per forward and reused by the backward, which moves the gradients the same way.
// CPU buffers (the MPI backend); the GPU form needs the NCCL communicator.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::dist {
class Comm;
}

namespace mt::nn {

class MoeDispatch {
   public:
    // offsets: [E + 1] i32 host, the permutation plan's rows per global expert (rows of expert j are
    // [offsets[j], offsets[j+1]) of the source buffer). Exchanges the per-expert counts with every ep rank
    // (collective over comm). E must be divisible by comm.size().
    void plan(const core::Tensor& offsets, dist::Comm& comm);
    // Rows this rank's experts receive in total, and their offsets per local expert: [El + 1] i32 host.
    int64_t expert_rows() const {
        return expert_rows_;
    }
    const core::Tensor& local_offsets() const {
        return local_offsets_;
    }
    // src: [R, C] rows by global expert (R = offsets[E]) -> dst: [expert_rows, C] rows by local expert. Collective.
    void to_experts(const core::Tensor& src, const core::Tensor& dst);
    // The inverse: src [expert_rows, C] by local expert -> dst [R, C] by global expert. Collective.
    void to_sources(const core::Tensor& src, const core::Tensor& dst);

   private:
    dist::Comm* comm_ = nullptr;
    std::vector<int64_t> send_rows_, recv_rows_;  // rows per peer rank
    std::vector<int64_t> order_;                  // received row i (by source) goes to expert-side row order_[i]
    int64_t source_rows_ = 0, expert_rows_ = 0;
    core::Tensor local_offsets_, staging_;
};

}  // namespace mt::nn
