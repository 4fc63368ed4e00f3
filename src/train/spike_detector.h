// The loss and gradient-norm spike detector (operations.md §4): over a window of the last W steps' values, the
// robust z-score z = (x - median) / (1.4826 MAD + eps) of the new value; a spike is z > spike_z after spike_warmup
// steps. Non-finite values are never spikes here: the trainer stops on them (or skips the step under dynamic loss
// scaling) before the detector sees the step. A spike's value does not enter the window, so a run of spikes does
// not teach the detector that spikes are normal.
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>

namespace mt::train {

struct SpikeVerdict {
    bool spike = false;
    double z = 0.0, median = 0.0, mad = 0.0;  // the statistics of the window it was judged against
};

class SpikeSeries {
   public:
    SpikeSeries(int64_t window, double threshold, int64_t warmup) : window_(window), z_(threshold), warmup_(warmup) {}
    // Judges x against the window (steps seen so far > warmup, at least 3 values), then adds it unless a spike.
    SpikeVerdict observe(double x);
    int64_t seen() const {
        return seen_;
    }
    // The window and the count of values seen, for checkpoints: a resumed run judges its next step against the
    // same window as the run that never stopped. load_state_json fails (exit 4) naming a malformed field.
    nlohmann::json state_json() const;
    void load_state_json(const nlohmann::json& j);

   private:
    int64_t window_;
    double z_;
    int64_t warmup_;
    int64_t seen_ = 0;
    std::deque<double> values_;
};

// Median and median absolute deviation of a set of values (empty: 0, 0).
std::pair<double, double> median_mad(const std::deque<double>& values);

}  // namespace mt::train
