// AdamW over a parameter table: first and second moments in the master dtype on the table's device; weight decay
// per tensor as the table says. Updates the master weights and refreshes the forward's copy.
// Replicated (the default): the moments of every parameter, each in one arena with the table's layout.
// ZeRO-1 (owned ranges given): only the arena elements this rank owns have moments, the ranges back to back,
// and step() updates only those elements; the caller reduce-scatters the gradients before and gathers the
// parameters after (parallel/grad_sync.h).
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

class AdamW {
   public:
    // owned: sorted, disjoint arena ranges (ZeRO-1); nullopt keeps state for every parameter.
    AdamW(nn::ParamTable& table,
          const ops::AdamWHyper& hyper,
          std::optional<std::vector<ArenaRange>> owned = std::nullopt);

    // One update with the given learning rate; step counts from 1 (bias correction). grad_scale multiplies
    // every gradient first (global-norm clipping).
    void step(double lr, int64_t step, double grad_scale);

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
    // The moments of a piece: flat views [end - begin].
    core::Tensor m(const Piece& p) const;
    core::Tensor v(const Piece& p) const;
    bool sharded() const {
        return sharded_;
    }
    // Bytes of optimizer state this rank allocates (both moments, alignment padding included).
    int64_t state_bytes() const;
    const ops::AdamWHyper& hyper() const {
        return hyper_;
    }

   private:
    nn::ParamTable* table_;
    ops::AdamWHyper hyper_;
    bool sharded_ = false;
    std::vector<Piece> pieces_;
    core::Tensor m_, v_;  // f32 or the table's dtype: the table's arena layout, or packed pieces when sharded
};

}  // namespace mt::optim
