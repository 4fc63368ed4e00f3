// Expert-parallel dispatch and combine (moe.md §3): the rows a rank routed, sorted by global expert, go by one
// all-to-all to the ranks that hold those experts, and the experts' outputs come back by the inverse all-to-all.
// Rank r of the ep group holds experts [r El, (r + 1) El), El = E / ep. A rank receives its rows grouped by source
// rank ([src][local expert][row]) and reorders them to [local expert][src][row], so that each local expert's rows
// are contiguous for the grouped GEMMs; the reverse path undoes both steps. The plan (counts and the reorder) is
// built once per forward and reused by the backward, which moves the gradients the same way.
// Two communicators over the same ep ranks: `counts` moves the per-expert row counts (host memory: MPI), `rows`
// moves the rows themselves (the rows' memory: MPI for CPU tensors, NCCL for GPU tensors). The reorders are row
// gathers (ops::moe_permute_fwd) on the rows' device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace mt::nn {

class MoeDispatch {
   public:
    // offsets: [E + 1] i32 host, the permutation plan's rows per global expert (rows of expert j are
    // [offsets[j], offsets[j+1]) of the source buffer). Exchanges the per-expert counts with every ep rank
    // (collective over `counts`). E must be divisible by the ep size. device: where the rows live.
    void plan(const core::Tensor& offsets, parallel::Comm& counts, parallel::Comm& rows, core::Device device);
    // Rows this rank's experts receive in total, and their offsets per local expert: [El + 1] i32 host.
    int64_t expert_rows() const {
        return expert_rows_;
    }
    const core::Tensor& local_offsets() const {
        return local_offsets_;
    }
    // src: [R, C] rows by global expert (R = offsets[E]) -> dst: [expert_rows, C] rows by local expert. Collective.
    // The host waits for the exchange (as before overlapped dispatch: its time is the all-to-all's).
    void to_experts(const core::Tensor& src, const core::Tensor& dst) {
        start_to_experts(src, dst);
        finish(/*block_host=*/true);
    }
    // The inverse: src [expert_rows, C] by local expert -> dst [R, C] by global expert. Collective.
    void to_sources(const core::Tensor& src, const core::Tensor& dst) {
        start_to_sources(src, dst);
        finish(/*block_host=*/true);
    }
    // The same in two halves, so that other work runs while the rows travel (overlapped dispatch,
    // docs/distributed.md "Overlapped dispatch"): start_* issues the all-to-all and returns; finish() completes the
    // one in flight and, for to_experts, reorders the received rows into dst. block_host false: on a GPU over NCCL
    // the ops' stream waits for the exchange instead of the host (CommWork::wait_on_device); the host backends wait
    // either way. Between the two, src and dst must stay untouched. One in flight at a time.
    void start_to_experts(const core::Tensor& src, const core::Tensor& dst);
    void start_to_sources(const core::Tensor& src, const core::Tensor& dst);
    void finish(bool block_host = false);

   private:
    // A [rows, C] staging buffer of src's dtype and device.
    core::Tensor staging(const core::Tensor& like, int64_t rows);

    parallel::Comm* rows_comm_ = nullptr;
    std::vector<int64_t> send_rows_, recv_rows_;  // rows per peer rank
    int64_t source_rows_ = 0, expert_rows_ = 0;
    core::Tensor local_offsets_;
    // Row indices on the rows' device: received row i (by source) is expert-side row by_expert[i]; expert-side row
    // j came in as received row by_source[j] (the inverse).
    core::Tensor by_expert_, by_source_;
    core::Tensor staging_;
    // The exchange in flight: its work, and for to_experts the received rows and where they go.
    parallel::CommWork pending_;
    bool in_flight_ = false;
    core::Tensor received_, pending_dst_;
};

}  // namespace mt::nn
