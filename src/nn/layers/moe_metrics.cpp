// MoE routing metrics and the routing-collapse detector (moe.md §4).
#include "nn/layers/moe_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace mt::nn {

nlohmann::json MoeStepMetrics::to_json(bool with_load) const {
    nlohmann::json j = {{"max_vio", max_vio},
                        {"min_vio", min_vio},
                        {"avg_vio", avg_vio},
                        {"load_var", load_var},
                        {"drop_rate", drop_rate},
                        {"bias_min", bias_min},
                        {"bias_max", bias_max},
                        {"bias_range", bias_range},
                        {"bias_step", bias_step},
                        {"token_entropy", token_entropy},
                        {"load_entropy", load_entropy},
                        {"n_eff", n_eff},
                        {"aux_loss", aux_loss},
                        {"imbalance_warning", imbalance_warning},
                        {"bias_range_warning", bias_range_warning}};
    if (with_load) j["load"] = load;
    return j;
}

MoeStepMetrics moe_metrics_compute(const std::vector<int64_t>& load,
                                   int64_t tokens,
                                   int64_t top_k,
                                   int64_t dropped,
                                   const std::vector<float>& bias,
                                   double bias_step,
                                   double token_entropy_sum,
                                   double aux_loss) {
    MoeStepMetrics m;
    m.load = load;
    m.tokens = tokens;
    m.top_k = top_k;
    m.dropped = dropped;
    m.bias_step = bias_step;
    m.aux_loss = aux_loss;
    const int64_t n = static_cast<int64_t>(load.size());
    const double rows = static_cast<double>(tokens * top_k);
    if (n > 0 && rows > 0) {
        const double mean = rows / static_cast<double>(n);
        m.max_vio = -1e300;
        m.min_vio = 1e300;
        double h = 0;
        for (int64_t c : load) {
            const double f = static_cast<double>(c) / mean;
            m.max_vio = std::max(m.max_vio, f - 1);
            m.min_vio = std::min(m.min_vio, f - 1);
            m.avg_vio += std::fabs(f - 1);
            m.load_var += (f - 1) * (f - 1);
            const double pi = static_cast<double>(c) / rows;
            if (pi > 0) h -= pi * std::log(pi);
        }
        m.avg_vio /= static_cast<double>(n);
        m.load_var /= static_cast<double>(n);
        m.n_eff = std::exp(h);
        m.load_entropy = n > 1 ? h / std::log(static_cast<double>(n)) : 0.0;
        m.drop_rate = static_cast<double>(dropped) / rows;
        m.token_entropy = token_entropy_sum / static_cast<double>(tokens);
    }
    if (!bias.empty()) {
        const auto [mn, mx] = std::minmax_element(bias.begin(), bias.end());
        m.bias_min = *mn;
        m.bias_max = *mx;
        m.bias_range = m.bias_max - m.bias_min;
    }
    m.imbalance_warning = m.load_var > 0.1;
    m.bias_range_warning = m.bias_range > 1.0;
    return m;
}

std::string MoeCollapseEvent::message() const {
    if (reason == "load_var")
        return fmt::format(
            "MoE routing collapse at step {}: load_var = {:.3g} above threshold for {} steps", step, value, streak);
    if (reason == "n_eff")
        return fmt::format(
            "MoE routing collapse at step {}: n_eff = {:.3g} below threshold for {} steps", step, value, streak);
    if (reason == "dead_expert")
        return fmt::format(
            "MoE routing collapse at step {}: expert {} got no tokens for {} steps", step, expert, streak);
    return fmt::format("MoE routing collapse at step {}: expert {} at {:.3g}x the mean load for {} steps",
                       step,
                       expert,
                       value,
                       streak);
}

nlohmann::json MoeCollapseEvent::to_json() const {
    return {{"event", "moe_collapse"},
            {"step", step},
            {"reason", reason},
            {"expert", expert},
            {"value", value},
            {"streak", streak},
            {"message", message()}};
}

MoeCollapseDetector::MoeCollapseDetector(int64_t num_experts, const MoeCollapseConfig& config) : config_(config) {
    MT_CHECK(config.window >= 1, "moe.alarm.window = {} must be >= 1", config.window);
    dead_streak_.assign(static_cast<size_t>(num_experts), 0);
    hot_streak_.assign(static_cast<size_t>(num_experts), 0);
}

std::optional<MoeCollapseEvent> MoeCollapseDetector::update(int64_t step, const MoeStepMetrics& m) {
    const bool active = step >= config_.start_step && m.tokens > 0;
    const int64_t n = static_cast<int64_t>(dead_streak_.size());
    MT_CHECK(
        static_cast<int64_t>(m.load.size()) == n, "moe collapse detector: {} loads for {} experts", m.load.size(), n);
    auto bump = [&](int64_t& streak, bool cond) { streak = active && cond ? streak + 1 : 0; };
    auto fires = [&](int64_t streak) { return streak > 0 && streak % config_.window == 0; };
    std::optional<MoeCollapseEvent> event;
    auto raise = [&](const char* reason, int64_t expert, double value, int64_t streak) {
        if (!event) event = MoeCollapseEvent{step, reason, expert, value, streak};
    };
    bump(load_var_streak_, m.load_var > config_.load_var_threshold);
    if (fires(load_var_streak_)) raise("load_var", -1, m.load_var, load_var_streak_);
    bump(n_eff_streak_, m.n_eff < config_.n_eff_fraction * static_cast<double>(n));
    if (fires(n_eff_streak_)) raise("n_eff", -1, m.n_eff, n_eff_streak_);
    const double mean = static_cast<double>(m.tokens * m.top_k) / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) {
        const double f = mean > 0 ? static_cast<double>(m.load[static_cast<size_t>(j)]) / mean : 0.0;
        int64_t& dead = dead_streak_[static_cast<size_t>(j)];
        bump(dead, config_.dead_experts && m.load[static_cast<size_t>(j)] == 0);
        if (fires(dead)) raise("dead_expert", j, 0.0, dead);
        int64_t& hot = hot_streak_[static_cast<size_t>(j)];
        bump(hot, config_.hot_load_factor > 0 && f > config_.hot_load_factor);
        if (fires(hot)) raise("hot_expert", j, f, hot);
    }
    if (event) ++alarms_;
    return event;
}

nlohmann::json MoeCollapseDetector::state_json() const {
    return {{"load_var_streak", load_var_streak_},
            {"n_eff_streak", n_eff_streak_},
            {"alarms", alarms_},
            {"dead_streak", dead_streak_},
            {"hot_streak", hot_streak_}};
}

void MoeCollapseDetector::load_state_json(const nlohmann::json& j) {
    try {
        auto dead = j.at("dead_streak").get<std::vector<int64_t>>();
        auto hot = j.at("hot_streak").get<std::vector<int64_t>>();
        if (dead.size() != dead_streak_.size() || hot.size() != hot_streak_.size())
            core::fail(core::ExitCode::checkpoint,
                       "MoE collapse detector state has {} experts, the model {}",
                       dead.size(),
                       dead_streak_.size());
        dead_streak_ = std::move(dead);
        hot_streak_ = std::move(hot);
        load_var_streak_ = j.at("load_var_streak").get<int64_t>();
        n_eff_streak_ = j.at("n_eff_streak").get<int64_t>();
        alarms_ = j.at("alarms").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
        core::fail(core::ExitCode::checkpoint, "MoE collapse detector state JSON is malformed: {}", e.what());
    }
}

}  // namespace mt::nn
