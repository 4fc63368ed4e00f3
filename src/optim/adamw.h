// AdamW over a parameter table: first and second moments each in one arena with the table's layout, in the
// master dtype on the table's device; weight decay per tensor as the table says. Updates the master weights and
// refreshes the forward's copy.
#pragma once

#include <cstdint>

#include "nn/param_table.h"
#include "ops/adamw.h"

namespace mt::optim {

class AdamW {
   public:
    AdamW(nn::ParamTable& table, const ops::AdamWHyper& hyper);

    // One update with the given learning rate; step counts from 1 (bias correction). grad_scale multiplies
    // every gradient first (global-norm clipping).
    void step(double lr, int64_t step, double grad_scale);

    core::Tensor m(int i) const {
        return table_->view(m_, i);
    }
    core::Tensor v(int i) const {
        return table_->view(v_, i);
    }
    const ops::AdamWHyper& hyper() const {
        return hyper_;
    }

   private:
    nn::ParamTable* table_;
    ops::AdamWHyper hyper_;
    core::Tensor m_, v_;  // arenas, f32 or the table's dtype
};

}  // namespace mt::optim
