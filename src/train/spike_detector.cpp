// Robust z-scores over a sliding window (operations.md §4).
#include "train/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace mt::train {

namespace {

double median_of(std::vector<double> v) {
    const size_t n = v.size(), h = n / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
    const double upper = v[h];
    if (n % 2 == 1) return upper;
    return 0.5 * (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h)) + upper);
}

}  // namespace

std::pair<double, double> median_mad(const std::deque<double>& values) {
    if (values.empty()) return {0.0, 0.0};
    const double med = median_of({values.begin(), values.end()});
    std::vector<double> dev;
    dev.reserve(values.size());
    for (double x : values) dev.push_back(std::abs(x - med));
    return {med, median_of(std::move(dev))};
}

SpikeVerdict SpikeSeries::observe(double x) {
    ++seen_;
    SpikeVerdict v;
    if (seen_ > warmup_ && values_.size() >= 3) {
        const auto [med, mad] = median_mad(values_);
        // eps keeps a perfectly flat window (MAD 0) from calling every change a spike: 1e-6 of the median's scale.
        const double eps = 1e-6 * std::max(std::abs(med), 1e-12);
        v = {.spike = false, .z = (x - med) / (1.4826 * mad + eps), .median = med, .mad = mad};
        v.spike = v.z > z_;
    }
    if (v.spike) return v;
    values_.push_back(x);
    if (static_cast<int64_t>(values_.size()) > window_) values_.pop_front();
    return v;
}

nlohmann::json SpikeSeries::state_json() const {
    return {{"seen", seen_}, {"values", std::vector<double>(values_.begin(), values_.end())}};
}

void SpikeSeries::load_state_json(const nlohmann::json& j) {
    if (!j.is_object() || !j.contains("seen") || !j.at("seen").is_number_integer() || !j.contains("values") ||
        !j.at("values").is_array())
        core::fail(core::ExitCode::checkpoint, "spike detector state needs an integer \"seen\" and a \"values\" array");
    seen_ = j.at("seen").get<int64_t>();
    values_.clear();
    for (const auto& v : j.at("values")) {
        if (!v.is_number()) core::fail(core::ExitCode::checkpoint, "spike detector state: a non-number in \"values\"");
        values_.push_back(v.get<double>());
    }
    while (static_cast<int64_t>(values_.size()) > window_) values_.pop_front();
}

}  // namespace mt::train
