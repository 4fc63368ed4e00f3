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

nlohmann::json MoeStepMetrics::modality_json(bool with_load, bool with_drop) const {
    nlohmann::json j = nlohmann::json::object();
    if (modality.empty()) return j;
    for (size_t i = 0; i < modality.size() && i < kMoeModalityNames.size(); ++i) {
        const MoeModalityMetrics& mm = modality[i];
        const std::string at = std::string("modality/") + kMoeModalityNames[i] + "/";
        j[at + "token_share"] = mm.token_share;
        j[at + "max_vio"] = mm.max_vio;
        j[at + "load_var"] = mm.load_var;
        if (with_drop) j[at + "drop_rate"] = mm.drop_rate;
        if (with_load) j[at + "load"] = mm.load;
    }
    j["image_share"] = image_share;
    for (size_t q = 0; q < kExpertImageShareStats.size(); ++q)
        j[std::string("expert_image_share_") + kExpertImageShareStats[q]] = expert_image_share[q];
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

std::vector<MoeStepMetrics> moe_modality_metrics_add(MoeStepMetrics& m,
                                                     const std::vector<std::vector<int64_t>>& load,
                                                     const std::vector<int64_t>& tokens,
                                                     const std::vector<int64_t>& dropped) {
    MT_CHECK(load.size() == tokens.size() && load.size() == dropped.size() && load.size() == kMoeModalityNames.size(),
             "moe modality metrics: {} loads, {} token counts, {} drop counts for {} modalities",
             load.size(),
             tokens.size(),
             dropped.size(),
             kMoeModalityNames.size());
    const size_t n = m.load.size();
    const int64_t total = std::accumulate(tokens.begin(), tokens.end(), int64_t{0});
    std::vector<MoeStepMetrics> full;
    m.modality.clear();
    for (size_t i = 0; i < load.size(); ++i) {
        MT_CHECK(
            load[i].size() == n, "moe modality metrics: {} loads of modality {} for {} experts", load[i].size(), i, n);
        full.push_back(moe_metrics_compute(load[i], tokens[i], m.top_k, dropped[i], {}, 0.0, 0.0, 0.0));
        const MoeStepMetrics& f = full.back();
        MoeModalityMetrics mm;
        mm.tokens = tokens[i];
        mm.dropped = dropped[i];
        mm.token_share = total > 0 ? static_cast<double>(tokens[i]) / static_cast<double>(total) : 0.0;
        mm.load = load[i];
        mm.max_vio = f.max_vio;
        mm.load_var = f.load_var;
        mm.drop_rate = f.drop_rate;
        m.modality.push_back(std::move(mm));
    }
    // phi_j over the experts with rows, against phi = the image tokens' share.
    const std::vector<int64_t>& image = load[1];
    m.image_share = total > 0 ? static_cast<double>(tokens[1]) / static_cast<double>(total) : 0.0;
    std::vector<double> phi;
    for (size_t j = 0; j < n; ++j) {
        int64_t rows = 0;
        for (const auto& l : load) rows += l[j];
        if (rows > 0) phi.push_back(static_cast<double>(image[j]) / static_cast<double>(rows));
    }
    std::sort(phi.begin(), phi.end());
    const std::array<double, 5> at = {0.0, 0.1, 0.5, 0.9, 1.0};
    for (size_t q = 0; q < at.size(); ++q) {
        if (phi.empty()) {
            m.expert_image_share[q] = 0.0;
            continue;
        }
        const double pos = at[q] * static_cast<double>(phi.size() - 1);
        const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, phi.size() - 1);
        m.expert_image_share[q] = phi[lo] + (pos - static_cast<double>(lo)) * (phi[hi] - phi[lo]);
    }
    return full;
}

std::string MoeCollapseEvent::message() const {
    if (!modality.empty()) {
        MoeCollapseEvent all = *this;
        all.modality.clear();
        return all.message() + fmt::format(" (the {} tokens' own rows)", modality);
    }
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
    nlohmann::json j = {{"event", "moe_collapse"},
                        {"step", step},
                        {"reason", reason},
                        {"expert", expert},
                        {"value", value},
                        {"streak", streak},
                        {"message", message()}};
    if (!modality.empty()) j["modality"] = modality;
    return j;
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
        if (!event) event = MoeCollapseEvent{step, reason, expert, value, streak, {}};
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

void MoeCollapseDetector::skip() {
    load_var_streak_ = n_eff_streak_ = 0;
    std::fill(dead_streak_.begin(), dead_streak_.end(), 0);
    std::fill(hot_streak_.begin(), hot_streak_.end(), 0);
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
