// Multi-step training alarms: see alarms.h.
#include "train/alarms.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "train/spike_detector.h"

namespace mt::train {

namespace {

std::vector<double> normalised(const std::vector<double>& v) {
    const double sum = std::accumulate(v.begin(), v.end(), 0.0);
    std::vector<double> p(v.size(), 0.0);
    if (sum > 0)
        for (size_t i = 0; i < v.size(); ++i) p[i] = v[i] / sum;
    return p;
}

double median_of(const std::deque<double>& v) {
    return median_mad(v).first;
}

}  // namespace

double total_variation(const std::vector<double>& p, const std::vector<double>& q) {
    if (p.empty() || q.empty() || p.size() != q.size()) return 0.0;
    const std::vector<double> a = normalised(p), b = normalised(q);
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) d += std::abs(a[i] - b[i]);
    return 0.5 * d;
}

std::vector<Alarm> AlarmMonitor::edge(const std::string& key, bool now, Alarm alarm) {
    bool& was = on_[key];
    const bool fire = now && !was;
    was = now;
    if (!fire) return {};
    ++totals_[alarm.kind];
    return {std::move(alarm)};
}

std::vector<Alarm> AlarmMonitor::observe_expert_loads(int64_t layer, const std::vector<int64_t>& load) {
    LayerLoads& l = layers_[layer];
    const std::vector<double> p = normalised(std::vector<double>(load.begin(), load.end()));
    if (std::accumulate(p.begin(), p.end(), 0.0) == 0.0) return {};  // no routed rows this step
    if (l.reference.empty()) l.reference = p;
    for (size_t i = 0; i < p.size(); ++i)
        l.reference[i] = (1.0 - config_.drift_ema) * l.reference[i] + config_.drift_ema * p[i];
    l.window.push_back(p);
    if (static_cast<int64_t>(l.window.size()) > config_.drift_window) l.window.pop_front();
    if (++l.steps <= std::max(config_.warmup, config_.drift_window)) return {};
    std::vector<double> recent(p.size(), 0.0);
    for (const auto& w : l.window)
        for (size_t i = 0; i < w.size(); ++i) recent[i] += w[i];
    const double tv = total_variation(recent, l.reference);
    return edge(fmt::format("drift/{}", layer),
                tv > config_.drift_tv,
                {"expert_load_drift",
                 fmt::format("expert loads of layer {} drifted: total-variation distance {:.3f} between the last {} "
                             "steps and the slow reference (health.drift_tv = {})",
                             layer,
                             tv,
                             l.window.size(),
                             config_.drift_tv),
                 {{"layer", layer}, {"tv", tv}}});
}

std::vector<Alarm> AlarmMonitor::observe_memory(double reserved_fraction) {
    return edge("memory",
                reserved_fraction > config_.memory_fraction,
                {"memory_pressure",
                 fmt::format("memory reserved is {:.1f}% of the device (health.memory_alarm = {})",
                             100.0 * reserved_fraction,
                             config_.memory_fraction),
                 {{"reserved_fraction", reserved_fraction}}});
}

std::vector<Alarm> AlarmMonitor::observe_throughput(double tokens_per_s) {
    if (!std::isfinite(tokens_per_s) || tokens_per_s <= 0) return {};
    std::vector<Alarm> out;
    if (++throughput_steps_ > config_.warmup && !throughput_.empty()) {
        const double median = median_of(throughput_);
        out = edge("throughput",
                   tokens_per_s < config_.throughput_ratio * median,
                   {"throughput_drop",
                    fmt::format("{:.0f} tokens/s is below {} x the median {:.0f} of the last {} steps",
                                tokens_per_s,
                                config_.throughput_ratio,
                                median,
                                throughput_.size()),
                    {{"tokens_per_s", tokens_per_s}, {"median", median}}});
    }
    throughput_.push_back(tokens_per_s);
    if (static_cast<int64_t>(throughput_.size()) > config_.throughput_window) throughput_.pop_front();
    return out;
}

std::vector<Alarm> AlarmMonitor::observe_rank_times(const std::vector<double>& busy_seconds, int64_t steps) {
    if (busy_seconds.size() < 2 || steps < 1) return {};
    if (!rank_times_.empty() && rank_times_.back().first.size() != busy_seconds.size())
        rank_times_.clear(), rank_time_steps_ = 0;
    rank_times_.emplace_back(busy_seconds, steps);
    rank_time_steps_ += steps;
    // Drop the oldest observations while the rest still cover the window.
    while (rank_time_steps_ - rank_times_.front().second >= config_.straggler_window) {
        rank_time_steps_ -= rank_times_.front().second;
        rank_times_.pop_front();
    }
    if (rank_time_steps_ < config_.straggler_window) return {};
    std::vector<double> mean(busy_seconds.size(), 0.0);
    for (const auto& [busy, n] : rank_times_)
        for (size_t r = 0; r < busy.size(); ++r)
            mean[r] += busy[r] * static_cast<double>(n) / static_cast<double>(rank_time_steps_);
    const double median = median_of({mean.begin(), mean.end()});
    std::vector<Alarm> out;
    for (size_t r = 0; r < mean.size(); ++r) {
        auto fired =
            edge(fmt::format("straggler/{}", r),
                 mean[r] > config_.straggler_ratio * median,
                 {"straggler",
                  fmt::format("rank {} is a straggler: {:.3f} s busy a step against the median rank's {:.3f} s "
                              "over the last {} steps (health.straggler_ratio = {})",
                              r,
                              mean[r],
                              median,
                              rank_time_steps_,
                              config_.straggler_ratio),
                  {{"rank", r}, {"busy_seconds", mean[r]}, {"median", median}}});
        out.insert(out.end(), fired.begin(), fired.end());
    }
    return out;
}

}  // namespace mt::train
