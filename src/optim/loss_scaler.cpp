// Dynamic loss scaling: skip on overflow, back off after `hysteresis` overflows, grow after a clean run.
#include "optim/loss_scaler.h"

#include <algorithm>

#include "core/error.h"

namespace mt::optim {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg), scale_(cfg.scale), hysteresis_left_(std::max<int64_t>(1, cfg.hysteresis)) {
    MT_CHECK(cfg.scale > 0, "loss scale must be positive, got {}", cfg.scale);
}

bool LossScaler::update(bool finite) {
    exhausted_ = false;
    if (!cfg_.dynamic) return finite;
    if (finite) {
        if (++clean_steps_ >= cfg_.growth_interval) {
            scale_ *= cfg_.growth_factor;
            clean_steps_ = 0;
            hysteresis_left_ = std::max<int64_t>(1, cfg_.hysteresis);
        }
        return true;
    }
    ++skipped_;
    clean_steps_ = 0;
    exhausted_ = scale_ <= cfg_.min_scale;
    if (--hysteresis_left_ <= 0) {
        scale_ = std::max(cfg_.min_scale, scale_ * cfg_.backoff_factor);
        hysteresis_left_ = std::max<int64_t>(1, cfg_.hysteresis);
    }
    return false;
}

nlohmann::json LossScaler::state() const {
    return {{"dynamic", cfg_.dynamic},
            {"scale", scale_},
            {"clean_steps", clean_steps_},
            {"hysteresis_left", hysteresis_left_},
            {"skipped", skipped_}};
}

void LossScaler::load_state(const nlohmann::json& state) {
    // A run that switches precision on resume (bf16 -> fp16) starts its dynamic scale afresh.
    if (!cfg_.dynamic || !state.value("dynamic", false)) return;
    scale_ = state.value("scale", scale_);
    clean_steps_ = state.value("clean_steps", clean_steps_);
    hysteresis_left_ = state.value("hysteresis_left", hysteresis_left_);
    skipped_ = state.value("skipped", skipped_);
}

}  // namespace mt::optim
