// QK-clip (muon.md §4), the layer-level half: from the per-head max pre-softmax logits S^h of a softmax attention
// layer, the row factors that scale its Wq and Wk so that no kv group's max logit exceeds tau (GQA/MHA: Megatron's
// clip_qk, Kimi K2), and their in-place application to a weight (whole, or a flat element range of it: a ZeRO-1
// owned slice). MLA is not in this model: there is no per-head rope/no-rope split of q and k here, so no MLA path.
// The trainer gathers the maxima (max over micro-batches, data-parallel span and cp) and calls these after the step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

constexpr double kQkClipTau = 100.0;  // optim.qk_clip_tau
constexpr double kQkClipAlpha = 0.5;  // optim.qk_clip_alpha

// The row factors of one attention layer's Wq [Hq * D, C] and Wk [Hkv * D, C] (rows head-major: head h is rows
// [h D, (h + 1) D)). A kv group g with S_g = max over its query heads of S^h > tau has eta_g = tau / S_g; every row
// of each query head of g gets eta_g^alpha, every row of kv head g gets eta_g^(1 - alpha); all other rows exactly 1.
struct QkClipFactors {
    std::vector<double> q_row_scale;  // [Hq * D]
    std::vector<double> k_row_scale;  // [Hkv * D]
    std::vector<double> group_eta;    // [Hkv]: eta_g, exactly 1 for a group left alone
    int64_t heads_clipped = 0;        // query heads in clipped groups
    int64_t groups_clipped = 0;       // kv groups clipped
    bool any = false;                 // some group clipped (heads_clipped > 0)
};

// The largest S^h over each kv group's query heads ([Hkv]); query head h is in group h / (Hq / Hkv).
// @param[in] head_max  S^h for the layer's Hq query heads (-inf where no logit was seen)
std::vector<double> qk_clip_group_max(const std::vector<double>& head_max, int64_t n_heads, int64_t n_kv_heads);

// The factors from per-group maxima S_g ([Hkv]). Under tensor parallelism with more ranks than kv heads a kv head
// is replicated on tp / Hkv ranks, each holding some of its query heads: S_g must first be max-reduced over those
// replicas (so that every copy of Wk gets the same factor), then passed here. A non-finite S_g (-inf: no logit
// tracked; NaN/inf: a broken step, which the health checks stop) leaves its group alone.
// @param[in] group_max  S_g for the layer's Hkv kv groups
// @param[in] n_heads, n_kv_heads  this rank's query and kv heads (Hq a multiple of Hkv)
// @param[in] head_dim  D, rows per head
// @param[in] tau  the threshold (> 0); alpha in [0, 1]: the share of the clip put on Wq
QkClipFactors qk_clip_factors_from_groups(const std::vector<double>& group_max,
                                          int64_t n_heads,
                                          int64_t n_kv_heads,
                                          int64_t head_dim,
                                          double tau = kQkClipTau,
                                          double alpha = kQkClipAlpha);

// The factors from per-head maxima S^h ([Hq]): qk_clip_factors_from_groups of qk_clip_group_max.
QkClipFactors qk_clip_factors(const std::vector<double>& head_max,
                              int64_t n_heads,
                              int64_t n_kv_heads,
                              int64_t head_dim,
                              double tau = kQkClipTau,
                              double alpha = kQkClipAlpha);

// Multiplies row r of `weight` by row_scale[r] in place; rows whose factor is exactly 1 are not touched (bitwise
// unchanged). On the GPU each run of consecutive scaled rows makes a host round trip (clips are rare and touch a few
// heads' rows; no device op scales rows by a per-row factor yet).
// @param[in,out] weight  [rows, cols] f32 or f64, contiguous, CPU or CUDA (a master weight)
// @param[in] row_scale  [rows], finite
void qk_clip_scale_rows(const core::Tensor& weight, const std::vector<double>& row_scale);

// As qk_clip_scale_rows, but only the weight's flat (row-major) elements [begin, end): a ZeRO-1 rank's owned slice of
// the weight, where element e is in row e / cols. Elements outside the range are not touched.
void qk_clip_scale_rows_range(const core::Tensor& weight,
                              const std::vector<double>& row_scale,
                              int64_t begin,
                              int64_t end);

}  // namespace mt::nn
