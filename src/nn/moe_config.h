// MoE configuration (moe.md §5, [moe] in the job TOML): the layer's settings, its balancing method and the
// routing-collapse alarm's thresholds. Kept apart from the layer so that ModelConfig can hold it by value.
#pragma once

#include <cstdint>

#include "nn/enum_names.h"
#include "ops/grouped_linear.h"
#include "ops/moe_permute.h"
#include "ops/moe_router.h"

namespace mt::nn {

// moe.balance (moe.md §2): Quantile Balancing, DeepSeek-V3's sign update, the auxiliary loss, or none.
enum class MoeBalanceMode { quantile, sign_bias, aux_loss, none };

template <>
struct EnumNames<MoeBalanceMode> {
    static constexpr std::array<std::pair<MoeBalanceMode, const char*>, 4> names = {
        {{MoeBalanceMode::quantile, "quantile"},
         {MoeBalanceMode::sign_bias, "sign_bias"},
         {MoeBalanceMode::aux_loss, "aux_loss"},
         {MoeBalanceMode::none, "none"}}};
};

template <>
struct EnumNames<ops::MoeScore> {
    static constexpr std::array<std::pair<ops::MoeScore, const char*>, 2> names = {
        {{ops::MoeScore::sigmoid, "sigmoid"}, {ops::MoeScore::softmax, "softmax"}}};
};

template <>
struct EnumNames<ops::MoeDropPolicy> {
    static constexpr std::array<std::pair<ops::MoeDropPolicy, const char*>, 2> names = {
        {{ops::MoeDropPolicy::probs, "probs"}, {ops::MoeDropPolicy::position, "position"}}};
};

template <>
struct EnumNames<ops::GroupedGemm> {
    static constexpr std::array<std::pair<ops::GroupedGemm, const char*>, 3> names = {
        {{ops::GroupedGemm::automatic, "auto"},
         {ops::GroupedGemm::device, "device"},
         {ops::GroupedGemm::cublaslt, "cublaslt"}}};
};

// moe.modality_bias (multimodal.md §4): how the router treats the token modalities of image + text batches (0 text,
// 1 image). off: one router and one balancer over all tokens. balanced: one balancer state per modality, a token of
// modality m selecting the top k of s + b_m (gates unchanged). learned: router logits z = W_r x + c_m with a learned
// c_m per modality (init 0, AdamW, no weight decay), with the one balancer.
enum class MoeModalityBias { off, balanced, learned };

template <>
struct EnumNames<MoeModalityBias> {
    static constexpr std::array<std::pair<MoeModalityBias, const char*>, 3> names = {
        {{MoeModalityBias::off, "off"},
         {MoeModalityBias::balanced, "balanced"},
         {MoeModalityBias::learned, "learned"}}};
};

// The token modalities of image + text batches (multimodal.md §3): the per-token id, and its name in the metrics.
inline constexpr int64_t kMoeModalities = 2;
inline constexpr std::array<const char*, kMoeModalities> kMoeModalityNames = {"text", "image"};

struct MoeBalanceConfig {
    MoeBalanceMode mode = MoeBalanceMode::quantile;
    // quantile (moe.quantile.*)
    int64_t bins = 1000;
    int64_t update_interval = 1;  // steps per update; 100-500 are supported
    double ema = 0.0;             // b <- ema b + (1 - ema) b'
    // sign_bias (moe.sign_bias.*)
    double sign_rate = 1e-3;
    bool sign_centered = true;
    int64_t sign_freeze_after_tokens = -1;  // -1: never freeze
    // aux_loss (moe.aux_loss.*; scope micro_batch)
    double aux_coeff = 1e-2;
};

// Thresholds of the routing-collapse alarm (moe.alarm.*). A condition counts at a step after start_step; the alarm
// fires when one condition has held for `window` consecutive steps (and again after every further window).
struct MoeCollapseConfig {
    int64_t start_step = 100;
    int64_t window = 100;
    double load_var_threshold = 0.1;  // load_var above this
    double n_eff_fraction = 0.5;      // n_eff below this fraction of n
    double hot_load_factor = 4.0;     // one expert's load above this multiple of the mean (0: off)
    bool dead_experts = true;         // the same expert with zero load
};

// The moe.* settings of moe.md §5 that the layer uses (first_k_dense and dense_ffn_dim belong to the model).
struct MoeConfig {
    int64_t num_experts = 64;
    int64_t top_k = 4;
    int64_t num_shared_experts = 1;
    int64_t expert_ffn_dim = 1024;
    ops::MoeScore score = ops::MoeScore::sigmoid;
    bool normalize_gates = true;
    double routed_scale = 2.5;
    double capacity_factor = 0.0;  // 0: dropless
    // Which rows an over-capacity expert drops: the lowest gates (probs) or the last in token order (position).
    ops::MoeDropPolicy drop_policy = ops::MoeDropPolicy::probs;
    // Under expert parallelism, other work of the layer runs while the rows travel: the shared experts' forward
    // during the dispatch, the router's backward during the gradients' trip back (moe_layer.cpp). The same ops on
    // the same data as the blocking order, so the same result bit for bit.
    bool overlap_dispatch = true;
    // The CUDA expert GEMMs (ops/grouped_linear.h): the one-launch device kernel, which reads the plan's offsets on
    // the device, so the layer copies them back only where something else needs them (expert parallelism's plan);
    // or cuBLASLt per expert from the host copy. auto: the device kernel where it takes the layer's dtypes and sizes
    // and is the faster of the two for the layer's rows per expert (the forward up to 1,024, the backward's dx up to
    // 512, its dw on cuBLASLt: MoeLayer::use_device_gemm, docs/moe.md).
    ops::GroupedGemm grouped_gemm = ops::GroupedGemm::automatic;
    MoeBalanceConfig balance;
    MoeCollapseConfig alarm;
    MoeModalityBias modality_bias = MoeModalityBias::off;
};

}  // namespace mt::nn
