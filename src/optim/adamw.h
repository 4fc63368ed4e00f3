// AdamW over a parameter table: first and second moments (f32, or bf16 with stochastic rounding) beside the master
// weights; weight decay per tensor as the table says. Updates the master weights and refreshes the forward's copy.
// Replicated (the default): the moments of every parameter, each in one arena with the table's layout.
// ZeRO-1 (owned ranges given): only the arena elements this rank owns have moments, the ranges back to back,
// and step() updates only those elements; the caller reduce-scatters the gradients before and gathers the
// parameters after (parallel/grad_sync.h).
// Offload (options.offload, optim.offload = "cpu"): the moments live in pinned host memory beside the table's host
// master weights (Precision::master_on_host); each step pipelines the gradient arena down in chunks, updates each
// chunk on the CPU (OpenMP) while the next one is copied, and copies the updated weights back up on the main lane,
// where the next forward's kernels queue behind them (docs/training.md "Memory").
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "nn/param_table.h"
#include "ops/adamw.h"

namespace mt::optim {

// Elements [begin, end) of the parameter arenas.
struct ArenaRange {
    int64_t begin = 0;
    int64_t end = 0;
};

struct AdamWOptions {
    core::DType state_dtype = core::DType::f32;  // f32 or bf16 (the master dtype must be f32 then)
    bool offload = false;                        // needs the table's master weights on the host, no sharding
    uint64_t seed = 0;                           // the stochastic rounding streams of bf16 moments
    int64_t offload_chunk = int64_t{1} << 24;    // arena elements per pipelined chunk (64 MiB of f32 gradients)
    // optim.name = "muon": only the table's AdamW group (nn::OptimGroup); the Muon group is optim::Muon's. The
    // moments cover the AdamW group's parameters only, back to back (or its ZeRO-1 slices).
    bool adamw_group_only = false;
};

class AdamW {
   public:
    // owned: sorted, disjoint arena ranges (ZeRO-1); nullopt keeps state for every parameter.
    AdamW(nn::ParamTable& table,
          const ops::AdamWHyper& hyper,
          std::optional<std::vector<ArenaRange>> owned = std::nullopt,
          const AdamWOptions& options = {});
    ~AdamW();
    AdamW(const AdamW&) = delete;
    AdamW& operator=(const AdamW&) = delete;

    // One update with the given learning rate; step counts from 1 (bias correction). grad_scale multiplies
    // every gradient first (global-norm clipping). update_sq (metrics.layer_stats; undefined: none): [table size]
    // f64 on update_device(), slot i += the squared L2 norm of the change this rank applied to parameter i (its
    // pieces), summed on the device (ops::adamw_step's update_sq); param_sq likewise, slot i += the squared L2 norm
    // of this rank's updated part of parameter i (ops::adamw_step's param_sq).
    void step(double lr,
              int64_t step,
              double grad_scale,
              const core::Tensor& update_sq = {},
              const core::Tensor& param_sq = {});
    // Where the update runs: the host under offload, else the model's device.
    core::Device update_device() const {
        return options_.offload ? core::Device::cpu : table_->precision().device;
    }

    // The part of parameter i whose state this optimizer holds: its flattened elements [begin, end), whose
    // moments start at state_offset in the state buffers.
    struct Piece {
        int param = 0;
        int64_t begin = 0, end = 0;
        int64_t state_offset = 0;
    };
    const std::vector<Piece>& pieces() const {
        return pieces_;
    }
    // The moments of a piece: flat views [end - begin] (host tensors under offload).
    core::Tensor m(const Piece& p) const;
    core::Tensor v(const Piece& p) const;
    bool sharded() const {
        return sharded_;
    }
    bool offloaded() const {
        return options_.offload;
    }
    // Bytes of optimizer state this rank allocates (both moments, alignment padding included), wherever they live,
    // and the part of it on the model's device (0 under offload on a GPU).
    int64_t state_bytes() const;
    int64_t device_state_bytes() const;
    const ops::AdamWHyper& hyper() const {
        return hyper_;
    }

   private:
    // The hyperparameters of piece p's elements (its weight decay off where the parameter has none; without p the
    // decay as configured), and the rounding stream of its elements from `begin` on.
    ops::AdamWHyper piece_hyper(double lr, const Piece* p = nullptr) const;
    ops::AdamWRounding piece_rounding(const Piece& p, int64_t begin) const;
    void step_offloaded(
        double lr, int64_t step, double grad_scale, const core::Tensor& update_sq, const core::Tensor& param_sq);
    void wait_uploads();

    nn::ParamTable* table_;
    ops::AdamWHyper hyper_;
    AdamWOptions options_;
    bool sharded_ = false;
    std::vector<Piece> pieces_;
    core::Tensor m_, v_;  // the table's arena layout, or packed pieces when sharded

    // Offload: the arena cut into chunks (pieces' sub-ranges), two gradient and two weight staging buffers in
    // pinned memory, and the markers of the weight uploads still in flight (waited for before a buffer is reused).
    struct Chunk {
        int64_t begin = 0, end = 0;  // arena elements
    };
    std::vector<Chunk> chunks_;
    core::Tensor grad_stage_[2], param_stage_[2];
    uint64_t upload_marker_[2] = {0, 0};
};

}  // namespace mt::optim
