// The weightings of loss.weighting (train/loss_weighting.h): the weights, the row multipliers the model takes, the
// objective, and the updates of the learned (uncertainty) and windowed (dwa) weights.
#include "train/loss_weighting.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::train {

LossWeighting::LossWeighting(const LossConfig& cfg, int64_t sources, double beta1, double beta2, double eps)
    : cfg_(cfg),
      k_(sources),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      s_(static_cast<size_t>(sources), 0.0),
      m_(s_),
      v_(s_),
      w_(static_cast<size_t>(sources), 1.0),
      window_sum_(s_),
      window_steps_(s_),
      last_(s_),
      before_(s_),
      l0_(s_) {
    MT_CHECK(sources > 0, "loss weighting over {} sources", sources);
}

std::vector<double> LossWeighting::weights() const {
    if (cfg_.weighting == "uncertainty") {
        std::vector<double> out;
        for (const double s : s_) out.push_back(std::exp(-s));
        return out;
    }
    return cfg_.weighting == "dwa" || cfg_.weighting == "gradnorm" ? w_
                                                                   : std::vector<double>(static_cast<size_t>(k_), 1.0);
}

std::vector<double> LossWeighting::multipliers(const std::vector<double>& n) const {
    MT_CHECK(std::ssize(n) == k_, "{} token counts for {} sources", n.size(), k_);
    std::vector<double> out = weights();
    if (cfg_.weighting != "uncertainty") return out;
    double total = 0.0;
    for (const double x : n) total += x;
    for (size_t i = 0; i < out.size(); ++i) out[i] = n[i] > 0 ? out[i] * total / n[i] : 0.0;
    return out;
}

double LossWeighting::objective(const std::vector<double>& c, const std::vector<double>& n) const {
    const std::vector<double> m = multipliers(n);
    double total = 0.0, sum = 0.0;
    for (const double x : n) total += x;
    for (size_t i = 0; i < m.size(); ++i) sum += m[i] * c[i];
    double out = total > 0 ? sum / total : 0.0;
    if (cfg_.weighting == "uncertainty")
        for (const double s : s_) out += 0.5 * s;
    return out;
}

void LossWeighting::update(const std::vector<double>& c, const std::vector<double>& n, double lr) {
    MT_CHECK(std::ssize(c) == k_ && std::ssize(n) == k_, "per-source sums for {} sources", k_);
    if (cfg_.weighting == "uncertainty") {
        // d/ds_i [exp(-s_i) L_i + s_i / 2] = -exp(-s_i) L_i + 1/2; AdamW without weight decay.
        ++t_;
        const double rate = cfg_.uncertainty_lr > 0 ? cfg_.uncertainty_lr : lr;
        const double c1 = 1.0 - std::pow(beta1_, static_cast<double>(t_));
        const double c2 = 1.0 - std::pow(beta2_, static_cast<double>(t_));
        for (size_t i = 0; i < s_.size(); ++i) {
            const double g = n[i] > 0 ? -std::exp(-s_[i]) * c[i] / n[i] + 0.5 : 0.0;
            m_[i] = beta1_ * m_[i] + (1.0 - beta1_) * g;
            v_[i] = beta2_ * v_[i] + (1.0 - beta2_) * g * g;
            s_[i] -= rate * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps_);
        }
    } else if (cfg_.weighting == "gradnorm") {
        gradnorm_step(c, n);
    } else if (cfg_.weighting == "dwa") {
        for (size_t i = 0; i < w_.size(); ++i) {
            if (n[i] <= 0) continue;
            window_sum_[i] += c[i] / n[i];
            window_steps_[i] += 1.0;
        }
        if (++window_step_ == cfg_.dwa_window) dwa_close_window();
    }
}

void LossWeighting::gradnorm_step(const std::vector<double>& c, const std::vector<double>& n) {
    MT_CHECK(std::ssize(g_) == k_, "gradnorm: {} gradient norms for {} sources", g_.size(), k_);
    // Over the sources with tokens in the step: L~_i = L_i(t) / L_i(0), r_i = L~_i / mean_k L~_k, G = mean_k G_k.
    std::vector<double> ratio(w_.size(), 0.0);
    double mean_ratio = 0.0, mean_g = 0.0;
    int present = 0;
    for (size_t i = 0; i < w_.size(); ++i) {
        if (n[i] <= 0) continue;
        const double l = c[i] / n[i];
        if (l0_[i] <= 0) l0_[i] = l;
        ratio[i] = l / l0_[i];
        mean_ratio += ratio[i];
        mean_g += g_[i];
        ++present;
    }
    if (present == 0 || mean_ratio <= 0) return;
    mean_ratio /= present;
    mean_g /= present;
    // L_grad = sum_i |G_i - sg(G r_i^a)|; G_i is w_i times the norm of grad_W(C_i / N), so dL_grad/dw_i =
    // sign(G_i - target_i) G_i / w_i. One gradient-descent step, kept positive, then renormalised to sum K.
    for (size_t i = 0; i < w_.size(); ++i) {
        if (n[i] <= 0) continue;
        const double target = mean_g * std::pow(ratio[i] / mean_ratio, cfg_.gradnorm_alpha);
        const double sign = g_[i] > target ? 1.0 : g_[i] < target ? -1.0 : 0.0;
        w_[i] = std::max(w_[i] - cfg_.gradnorm_lr * sign * g_[i] / w_[i], 1e-3);
    }
    double sum = 0.0;
    for (const double w : w_) sum += w;
    for (double& w : w_) w *= static_cast<double>(k_) / sum;
}

void LossWeighting::dwa_close_window() {
    // L_hat of the window; a source without tokens in the whole window keeps its last mean (rho = 1 next).
    before_ = last_;
    for (size_t i = 0; i < w_.size(); ++i)
        if (window_steps_[i] > 0) last_[i] = window_sum_[i] / window_steps_[i];
    std::fill(window_sum_.begin(), window_sum_.end(), 0.0);
    std::fill(window_steps_.begin(), window_steps_.end(), 0.0);
    window_step_ = 0;
    ++windows_;
    if (windows_ < 2) return;  // w = 1 through the first two windows
    // w_i = K exp(rho_i / tau) / sum_k exp(rho_k / tau), rho_i = L_hat_i(t-1) / L_hat_i(t-2).
    std::vector<double> e(w_.size());
    double sum = 0.0;
    for (size_t i = 0; i < w_.size(); ++i) {
        const double rho = before_[i] > 0 ? last_[i] / before_[i] : 1.0;
        e[i] = std::exp(rho / cfg_.dwa_temperature);
        sum += e[i];
    }
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = static_cast<double>(k_) * e[i] / sum;
}

nlohmann::json LossWeighting::state() const {
    return {{"weighting", cfg_.weighting},
            {"sources", k_},
            {"s", s_},
            {"m", m_},
            {"v", v_},
            {"t", t_},
            {"w", w_},
            {"window_sum", window_sum_},
            {"window_steps", window_steps_},
            {"last", last_},
            {"before", before_},
            {"l0", l0_},
            {"window_step", window_step_},
            {"windows", windows_}};
}

void LossWeighting::load(const nlohmann::json& state) {
    const std::string weighting = state.value("weighting", std::string());
    const int64_t sources = state.value("sources", int64_t{0});
    if (weighting != cfg_.weighting || sources != k_)
        core::fail_hint(core::ExitCode::checkpoint,
                        "resume with the loss.weighting and data.sources the checkpoint was written with",
                        "the checkpoint's loss weighting is \"{}\" over {} sources, the config's \"{}\" over {}",
                        weighting,
                        sources,
                        cfg_.weighting,
                        k_);
    s_ = state.at("s").get<std::vector<double>>();
    m_ = state.at("m").get<std::vector<double>>();
    v_ = state.at("v").get<std::vector<double>>();
    t_ = state.at("t").get<int64_t>();
    w_ = state.at("w").get<std::vector<double>>();
    window_sum_ = state.at("window_sum").get<std::vector<double>>();
    window_steps_ = state.at("window_steps").get<std::vector<double>>();
    last_ = state.at("last").get<std::vector<double>>();
    before_ = state.at("before").get<std::vector<double>>();
    l0_ = state.at("l0").get<std::vector<double>>();
    window_step_ = state.at("window_step").get<int64_t>();
    windows_ = state.at("windows").get<int64_t>();
}

}  // namespace mt::train
