// Loss scaling for fp16 training, as torch.cuda.amp.GradScaler and Megatron-LM's DynamicGradScaler: the loss
// gradient is multiplied by `scale` so that small activation gradients survive fp16's narrow exponent range; the
// optimizer divides it out again. Dynamic mode: a step whose gradients overflow (inf/nan) is skipped and the scale
// backs off; after `growth_interval` clean steps in a row it grows.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace mt::optim {

struct LossScalerConfig {
    bool dynamic = false;        // false: a fixed scale (1 for bf16/f32 training)
    double scale = 1.0;          // the fixed scale, or the dynamic one's start
    double growth_factor = 2.0;  // after growth_interval clean steps
    double backoff_factor = 0.5;
    int64_t growth_interval = 1000;
    int64_t hysteresis = 2;  // overflowing steps (in a row of skipped ones) tolerated before backing off
    double min_scale = 1.0;
};

class LossScaler {
   public:
    explicit LossScaler(const LossScalerConfig& cfg = {});

    double scale() const {
        return scale_;
    }
    bool dynamic() const {
        return cfg_.dynamic;
    }
    // After a backward pass: `finite` tells whether every gradient was finite. Returns true when the optimizer
    // should step. With a fixed scale it always returns `finite` (the caller treats an overflow as fatal).
    bool update(bool finite);
    // Skipped steps so far (overflows).
    int64_t skipped() const {
        return skipped_;
    }
    // True when the last update overflowed at the minimum scale: nothing left to back off to.
    bool exhausted() const {
        return exhausted_;
    }

    // Checkpoint state, so that resume is exact. load_state applies only when both sides are dynamic.
    nlohmann::json state() const;
    void load_state(const nlohmann::json& state);

   private:
    LossScalerConfig cfg_;
    double scale_;
    int64_t clean_steps_ = 0;
    int64_t hysteresis_left_;
    int64_t skipped_ = 0;
    bool exhausted_ = false;
};

}  // namespace mt::optim
