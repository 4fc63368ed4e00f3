// MoE combine (moe.md §1.2 step 4, §1.4): the gate-weighted sum of each token's expert output rows, in slot order.
//   yp:       [R, C] f32|f64   expert output rows, grouped by expert (ops/moe_permute.h)
//   slot_row: [N, K] i32       the buffer row of slot (i, q), or -1 (dropped: contributes 0)
//   gates:    [N, K]
//   y:        [N, C]           y_i = sum_q g_iq yp[slot_row(i, q)] (written, =)
// _bwd: saves yp (and the plan). dy [N, C] -> dyp [R, C] written (=, row (i, q) gets g_iq dy_i), dgates [N, K]
// written (=, dy_i . yp[slot_row(i, q)], 0 for a dropped slot).
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

void moe_unpermute_fwd(const Tensor& yp, const Tensor& slot_row, const Tensor& gates, const Tensor& y);
void moe_unpermute_bwd(const Tensor& yp,
                       const Tensor& slot_row,
                       const Tensor& gates,
                       const Tensor& dy,
                       const Tensor& dyp,
                       const Tensor& dgates);

}  // namespace mt::ops
