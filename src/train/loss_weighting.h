// The multi-task loss weighting of loss.weighting (multimodal.md §5, docs/multimodal.md "Mixed sources and loss
// weighting") over the sources of a data.sources mixture. For source i over the global batch: C_i the summed token
// cross-entropy, N_i its supervised tokens, N = sum N_i, L_i = C_i / N_i. Every weighting is a weight per token of a
// source's rows: token_mean 1 / N, uncertainty exp(-s_i) / N_i, gradnorm and dwa w_i / N. The model takes it relative
// to the token mean (a row multiplier m_i = N x that weight), so token_mean is the plain loss, unchanged.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"

namespace mt::train {

class LossWeighting {
   public:
    // sources: K; beta1, beta2, eps: the AdamW constants of the uncertainty's s_i (train.beta1, beta2, eps).
    LossWeighting(const LossConfig& cfg, int64_t sources, double beta1, double beta2, double eps);

    bool plain() const {
        return cfg_.weighting == "token_mean";
    }
    // Each source's weight in the form of multimodal.md §5: token_mean 1, uncertainty exp(-s_i), gradnorm and dwa w_i.
    std::vector<double> weights() const;
    // Each source's row multiplier m_i against the token mean 1 / N, from this step's N_i (global): token_mean 1,
    // uncertainty N exp(-s_i) / N_i (0 where N_i = 0), gradnorm and dwa w_i.
    std::vector<double> multipliers(const std::vector<double>& n) const;
    // The training loss of the step from C_i and N_i: sum_i m_i C_i / N, plus sum_i s_i / 2 under uncertainty.
    double objective(const std::vector<double>& c, const std::vector<double>& n) const;
    // After an applied step: uncertainty takes one AdamW step on s (gradient -exp(-s_i) L_i + 1/2, 0 for a source
    // without tokens in the step) at learning rate lr; gradnorm takes one gradient-descent step on w from L_grad of
    // the norms set_grad_norms gave (train/loss_gradnorm.h); dwa adds L_i to its window and closes the window after
    // loss.dwa_window steps. token_mean keeps no state.
    void update(const std::vector<double>& c, const std::vector<double>& n, double lr);
    // gradnorm: this step's G_i = ||grad_W (w_i C_i / N)||_2, measured at the weights in force.
    void set_grad_norms(std::vector<double> g) {
        g_ = std::move(g);
    }

    // The state for checkpoints (exact: every double survives the JSON text), and its restore; a state of another
    // weighting or source count is refused (exit 4).
    nlohmann::json state() const;
    void load(const nlohmann::json& state);

    const std::vector<double>& log_variances() const {
        return s_;
    }

   private:
    void dwa_close_window();
    void gradnorm_step(const std::vector<double>& c, const std::vector<double>& n);

    LossConfig cfg_;
    int64_t k_;
    double beta1_, beta2_, eps_;
    // uncertainty: s_i and their AdamW moments, and the steps taken.
    std::vector<double> s_, m_, v_;
    int64_t t_ = 0;
    // gradnorm and dwa: the weights in force; dwa: the open window's sums of L_i and the steps each counted, the
    // windows closed, and the last two closed windows' means (last: L_hat(t-1), before: L_hat(t-2)).
    std::vector<double> w_, window_sum_, window_steps_, last_, before_;
    int64_t window_step_ = 0, windows_ = 0;
    // gradnorm: L_i(0) (the source's first mean loss; 0 before it has one) and the step's G_i.
    std::vector<double> l0_, g_;
};

}  // namespace mt::train
