// Learning-rate schedules.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mt::optim {

namespace {

// ceil(decay_ratio * total_steps), except that a product within rounding of an integer is that integer: 0.07 * 100
// is 7.000000000000001 in f64, and a plain ceil would decay over 8 steps instead of the 7 the config asks for.
int64_t wsd_decay_steps(double decay_ratio, int64_t total_steps) {
    const double want = decay_ratio * static_cast<double>(total_steps);
    const double nearest = std::round(want);
    if (std::abs(want - nearest) <= 1e-9 * std::max(1.0, want)) return static_cast<int64_t>(nearest);
    return static_cast<int64_t>(std::ceil(want));
}

}  // namespace

double LrSchedule::at(int64_t step) const {
    const double min_lr = lr * min_lr_ratio;
    if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    switch (kind) {
        case ScheduleKind::constant:
            return lr;
        case ScheduleKind::cosine: {
            const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
            const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
            return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
        }
        case ScheduleKind::wsd: {
            const int64_t decay_steps = wsd_decay_steps(decay_ratio, total_steps);
            const int64_t decay_start = total_steps - decay_steps;
            if (step < decay_start || decay_steps <= 0) return lr;
            const double progress = std::min(1.0, static_cast<double>(step - decay_start + 1) / decay_steps);
            return lr + (min_lr - lr) * progress;
        }
    }
    return lr;
}

bool schedule_kind_from_name(const std::string& name, ScheduleKind* out) {
    if (name == "cosine")
        *out = ScheduleKind::cosine;
    else if (name == "wsd")
        *out = ScheduleKind::wsd;
    else if (name == "constant")
        *out = ScheduleKind::constant;
    else
        return false;
    return true;
}

}  // namespace mt::optim
