// Learning-rate schedules.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mt::optim {

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
            const auto decay_steps = static_cast<int64_t>(std::ceil(decay_ratio * static_cast<double>(total_steps)));
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
