// Learning-rate schedules: linear warmup, then cosine decay to min_lr, WSD (warmup-stable-decay: constant, then
// a linear decay to min_lr over the last decay_ratio of the steps, as MiniCPM / DeepSeek), or constant.
#pragma once

#include <cstdint>
#include <string>

namespace mt::optim {

enum class ScheduleKind { cosine, wsd, constant };

struct LrSchedule {
    ScheduleKind kind = ScheduleKind::cosine;
    double lr = 1e-3;
    double min_lr_ratio = 0.1;
    int64_t warmup_steps = 0;
    int64_t total_steps = 1;
    double decay_ratio = 0.2;  // WSD only

    // Learning rate of 0-based step `step` (warmup reaches lr at step warmup_steps - 1).
    double at(int64_t step) const;
};

bool schedule_kind_from_name(const std::string& name, ScheduleKind* out);

}  // namespace mt::optim
