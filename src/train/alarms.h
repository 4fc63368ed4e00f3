// The training alarms of operations.md §5 that look at more than one step (docs/operations.md "Alarms"): expert-load
// drift, memory pressure, throughput drop and straggler rank. Each judges what the trainer hands it after a step and
// answers with the alarms that start at this step: an alarm fires when its condition becomes true and again only
// after it was false once (a condition that holds for many steps is one alarm, not one per step). The spike, non-
// finite and routing-collapse alarms live with their detectors (spike_detector.h, nn/layers/moe_metrics.h); hang and
// restart are the supervisor's.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::train {

// Every alarm kind the trainer raises (operations.md §5): the four of AlarmMonitor, the spike and non-finite alarms
// of the spike detector and the routing collapse of the MoE metrics. The metric registry's alarms/<kind>, the train
// line's counts and the dashboard's event filter all read this one list.
inline constexpr std::array<const char*, 8> kTrainerAlarmKinds = {"expert_load_drift",
                                                                  "grad_spike",
                                                                  "loss_spike",
                                                                  "memory_pressure",
                                                                  "moe_collapse",
                                                                  "nonfinite",
                                                                  "straggler",
                                                                  "throughput_drop"};

struct AlarmConfig {
    double drift_tv = 0.2;            // expert_load_drift: total-variation distance above this
    int64_t drift_window = 50;        // steps in "the last window" of loads
    double drift_ema = 0.01;          // the slow reference's EMA weight per step
    double memory_fraction = 0.95;    // memory_pressure: reserved above this fraction of the device
    double throughput_ratio = 0.7;    // throughput_drop: tokens/s below this times the median of the last window
    int64_t throughput_window = 100;  // steps in that median
    double straggler_ratio = 1.2;     // straggler: a rank's mean busy time above this times the median rank's
    int64_t straggler_window = 20;    // steps in that mean (one slow step is noise, a slow rank stays slow)
    int64_t warmup = 100;             // steps before drift and throughput are judged
};

struct Alarm {
    std::string kind;  // expert_load_drift | memory_pressure | throughput_drop | straggler
    std::string detail;
    nlohmann::json fields;  // kind-specific values for the event line
};

// Total-variation distance 0.5 sum |p_i - q_i| of two distributions (each normalised here; an empty one: 0).
double total_variation(const std::vector<double>& p, const std::vector<double>& q);

class AlarmMonitor {
   public:
    explicit AlarmMonitor(AlarmConfig config) : config_(config) {}

    // One MoE layer's per-expert loads (routed rows) of the step: the last drift_window steps' distribution against
    // the slow EMA reference of the per-step distributions.
    std::vector<Alarm> observe_expert_loads(int64_t layer, const std::vector<int64_t>& load);
    // The memory reserved over the device's total, at the step's end.
    std::vector<Alarm> observe_memory(double reserved_fraction);
    // The step's own tokens per second (not the run's average).
    std::vector<Alarm> observe_throughput(double tokens_per_s);
    // Every rank's mean busy seconds a step (its step time less its waits for the other ranks) over the last `steps`
    // steps (the trainer shares them once per train line); judged on each rank's mean over the newest observations
    // that cover at least straggler_window steps, once that many were seen.
    std::vector<Alarm> observe_rank_times(const std::vector<double>& busy_seconds, int64_t steps = 1);

    // Alarms raised so far, by kind.
    const std::map<std::string, int64_t>& totals() const {
        return totals_;
    }

   private:
    // Fires `alarm` when `now` and the condition `key` was off at the last look; records the state.
    std::vector<Alarm> edge(const std::string& key, bool now, Alarm alarm);
    struct LayerLoads {
        std::deque<std::vector<double>> window;  // the last drift_window steps' distributions
        std::vector<double> reference;           // the slow EMA
        int64_t steps = 0;
    };
    AlarmConfig config_;
    std::map<int64_t, LayerLoads> layers_;
    std::deque<double> throughput_;
    std::deque<std::pair<std::vector<double>, int64_t>> rank_times_;  // (per-rank mean, steps it covers)
    int64_t rank_time_steps_ = 0;                                     // the steps rank_times_ covers
    int64_t throughput_steps_ = 0;
    std::map<std::string, bool> on_;
    std::map<std::string, int64_t> totals_;
};

}  // namespace mt::train
