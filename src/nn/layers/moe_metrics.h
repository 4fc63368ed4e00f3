// MoE routing metrics of one step (moe.md §4) and the routing-collapse detector. The metrics are computed from the
// per-expert loads (the router's pre-drop choices, summed over the step's micro-batches), the dropped rows, the bias
// and the summed token entropies; to_json() gives the JSONL fields.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nn/moe_config.h"

namespace mt::nn {

// One modality's routing of a step (multimodal.md §4, image + text batches): its tokens' share of the step's, and the
// balance of its own rows against its own mean T_m k / n.
struct MoeModalityMetrics {
    int64_t tokens = 0, dropped = 0;
    double token_share = 0;            // T_m / T
    std::vector<int64_t> load;         // [n] rows of the modality's tokens per expert (pre-drop)
    double max_vio = 0, load_var = 0;  // as MoeStepMetrics's, with f_j = load_j / (T_m k / n)
    double drop_rate = 0;              // dropped / (T_m k)
};

struct MoeStepMetrics {
    std::vector<int64_t> load;  // [n] rows per expert (pre-drop)
    int64_t tokens = 0, top_k = 0, dropped = 0;
    double max_vio = 0, min_vio = 0, avg_vio = 0;  // max f - 1, min f - 1, mean |f - 1|, f_j = load_j / (T k / n)
    double load_var = 0;                           // mean (f - 1)^2
    double drop_rate = 0;                          // dropped / (T k)
    double bias_min = 0, bias_max = 0, bias_range = 0, bias_step = 0;
    double token_entropy = 0;  // mean_t H(p_t) / ln n
    double load_entropy = 0;   // H(load / (T k)) / ln n
    double n_eff = 0;          // exp(H(load / (T k)))
    double aux_loss = 0;
    bool imbalance_warning = false;   // load_var > 0.1
    bool bias_range_warning = false;  // bias_range > 1 (sigmoid scores)
    // Image + text batches (the layer saw token modalities; empty otherwise): per modality (kMoeModalityNames order),
    // the image share of the step's tokens phi (= of its pre-drop rows), and the experts' own image shares phi_j =
    // image rows of j / rows of j over the experts with rows: min, p10, p50, p90, max (linear interpolation between
    // the sorted values; all 0 when no expert has rows).
    std::vector<MoeModalityMetrics> modality;
    double image_share = 0;
    std::array<double, 5> expert_image_share = {};

    // The JSONL fields; the per-expert loads only when with_load (moe.log_loads_every).
    nlohmann::json to_json(bool with_load) const;
    // The per-modality fields ("modality/<name>/<stat>", "image_share", "expert_image_share_<q>"), the per-expert loads
    // only when with_load, the drop rates only when with_drop (capacity dropping on); empty without modalities.
    nlohmann::json modality_json(bool with_load, bool with_drop) const;
};

// The names of the expert image-share summary (MoeStepMetrics::expert_image_share).
inline constexpr std::array<const char*, 5> kExpertImageShareStats = {"min", "p10", "p50", "p90", "max"};

// Metrics from the step's totals. token_entropy_sum = sum over tokens of H(p_t) / ln n (ops::moe_token_entropy_sum).
MoeStepMetrics moe_metrics_compute(const std::vector<int64_t>& load,
                                   int64_t tokens,
                                   int64_t top_k,
                                   int64_t dropped,
                                   const std::vector<float>& bias,
                                   double bias_step,
                                   double token_entropy_sum,
                                   double aux_loss);

// Adds the per-modality metrics and the experts' image shares to m (multimodal.md §4), from the step's per-modality
// loads [M][n] (pre-drop rows), tokens [M] and dropped rows [M]; modality 1 is the image. Returns each modality's full
// metrics (moe_metrics_compute on its own rows), which its collapse detector judges.
std::vector<MoeStepMetrics> moe_modality_metrics_add(MoeStepMetrics& m,
                                                     const std::vector<std::vector<int64_t>>& load,
                                                     const std::vector<int64_t>& tokens,
                                                     const std::vector<int64_t>& dropped);

struct MoeCollapseEvent {
    int64_t step = 0;
    std::string reason;    // "load_var", "n_eff", "dead_expert", "hot_expert"
    int64_t expert = -1;   // the expert for dead_expert / hot_expert
    double value = 0;      // load_var, n_eff or the expert's f
    int64_t streak = 0;    // consecutive steps the condition held
    std::string modality;  // the modality whose own rows collapsed ("text", "image"), or empty: all tokens
    std::string message() const;
    nlohmann::json to_json() const;
};

class MoeCollapseDetector {
   public:
    MoeCollapseDetector() = default;
    MoeCollapseDetector(int64_t num_experts, const MoeCollapseConfig& config);
    // Feeds one step's metrics; returns the alarm when one fires at this step (the first condition found, in the
    // order load_var, n_eff, dead_expert, hot_expert).
    std::optional<MoeCollapseEvent> update(int64_t step, const MoeStepMetrics& m);
    // A step the detector does not judge (a modality with too few tokens): every streak starts over.
    void skip();
    int64_t alarms_total() const {
        return alarms_;
    }
    nlohmann::json state_json() const;
    void load_state_json(const nlohmann::json& j);

   private:
    MoeCollapseConfig config_;
    int64_t load_var_streak_ = 0, n_eff_streak_ = 0, alarms_ = 0;
    std::vector<int64_t> dead_streak_, hot_streak_;
};

}  // namespace mt::nn
