// MoE metrics (nn/layers/moe_metrics.h, moe.md §4) on hand-computed loads, and the collapse detector's streak rules.
#include "nn/layers/moe_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mt::nn {
namespace {

TEST(MoeMetrics, HandComputedLoads) {
    // 3 tokens, k = 4, n = 4: mean load 3, f = 2, 2/3, 0, 4/3; 3 of 12 rows dropped
    const MoeStepMetrics m = moe_metrics_compute({6, 2, 0, 4}, 3, 4, 3, {-0.5f, 0.25f, 0.0f, 0.25f}, 0.01, 2.4, 0.02);
    EXPECT_DOUBLE_EQ(m.max_vio, 1.0);
    EXPECT_DOUBLE_EQ(m.min_vio, -1.0);
    EXPECT_NEAR(m.avg_vio, 2.0 / 3.0, 1e-15);
    EXPECT_NEAR(m.load_var, 5.0 / 9.0, 1e-15);
    EXPECT_DOUBLE_EQ(m.drop_rate, 0.25);
    const double h = -(0.5 * std::log(0.5) + std::log(1.0 / 6.0) / 6.0 + std::log(1.0 / 3.0) / 3.0);
    EXPECT_NEAR(m.n_eff, std::exp(h), 1e-14);
    EXPECT_NEAR(m.load_entropy, h / std::log(4.0), 1e-14);
    EXPECT_NEAR(m.token_entropy, 0.8, 1e-15);
    EXPECT_DOUBLE_EQ(m.bias_range, 0.75);
    EXPECT_TRUE(m.imbalance_warning);
    EXPECT_FALSE(m.bias_range_warning);
    const nlohmann::json j = m.to_json(true);
    EXPECT_EQ(j.at("load"), nlohmann::json({6, 2, 0, 4}));
    EXPECT_DOUBLE_EQ(j.at("aux_loss").get<double>(), 0.02);
    EXPECT_FALSE(m.to_json(false).contains("load"));
}

TEST(MoeCollapseDetector, StreaksStartStepAndRepeats) {
    MoeCollapseConfig cfg;
    cfg.start_step = 2;
    cfg.window = 3;
    cfg.load_var_threshold = 1e9;  // only the dead-expert rule can fire here
    cfg.n_eff_fraction = 0.0;
    cfg.hot_load_factor = 0.0;
    MoeCollapseDetector d(4, cfg);
    const MoeStepMetrics dead = moe_metrics_compute({4, 4, 4, 0}, 3, 4, 0, {}, 0, 0, 0);
    const MoeStepMetrics fine = moe_metrics_compute({3, 3, 3, 3}, 3, 4, 0, {}, 0, 0, 0);
    std::vector<int64_t> fired;
    for (int64_t step = 0; step < 12; ++step) {
        const auto ev = d.update(step, step == 8 ? fine : dead);
        if (ev) {
            fired.push_back(step);
            EXPECT_EQ(ev->reason, "dead_expert");
            EXPECT_EQ(ev->expert, 3);
        }
    }
    // counts from step 2: fires at 4 (streak 3) and 7 (streak 6); step 8 breaks it; 9, 10, 11 fire at 11
    EXPECT_EQ(fired, (std::vector<int64_t>{4, 7, 11}));
    EXPECT_EQ(d.alarms_total(), 3);
    MoeCollapseDetector e(4, cfg);
    e.load_state_json(d.state_json());
    EXPECT_EQ(e.state_json(), d.state_json());
}

}  // namespace
}  // namespace mt::nn
