// MoE token permutation (moe.md §1.2, §1.3): the plan that orders the (token, slot) pairs by expert, with optional
// capacity dropping, and the gather of token rows into the expert-grouped buffer.
//   indices:   [N, K] i32           the router's choice I (values in [0, E))
//   gates:     [N, K] f32|f64       used by the "probs" drop policy only (may be undefined otherwise)
//   offsets:   [E + 1] i32          expert e owns rows [offsets[e], offsets[e+1]) of the buffer; offsets[E] = R
//   slot_row:  [N, K] i32           the buffer row of slot (i, q), or -1 when the slot was dropped
//   row_token: [N * K] i32          the token of each buffer row; entries from R on are -1
// Within an expert, rows are in ascending (i, q) order. capacity = 0 keeps every row (dropless); capacity C > 0 keeps
// at most C rows per expert: the C largest gates (ties by token index, then slot) with MoeDropPolicy::probs, the first
// C in token order with MoeDropPolicy::position.
//
// moe_permute_fwd: x [N, C] f32|f64, row_token [R] i32 (the first R entries of the plan's) -> xp [R, C] (=).
// moe_permute_bwd: slot_row [N, K], dxp [R, C] -> dx [N, C] written (=): dx_i = sum_q dxp[slot_row(i, q)], slot order.
#pragma once

#include <cstdint>

#include "ops/op_common.h"

namespace mt::ops {

enum class MoeDropPolicy { probs, position };

// Fills offsets, slot_row and row_token (CPU tensors; integer work only); returns R, the number of rows kept.
int64_t moe_permute_plan(const Tensor& indices,
                         const Tensor& gates,
                         int64_t num_experts,
                         int64_t capacity,
                         MoeDropPolicy policy,
                         const Tensor& offsets,
                         const Tensor& slot_row,
                         const Tensor& row_token);

void moe_permute_fwd(const Tensor& x, const Tensor& row_token, const Tensor& xp);
void moe_permute_bwd(const Tensor& slot_row, const Tensor& dxp, const Tensor& dx);

}  // namespace mt::ops
