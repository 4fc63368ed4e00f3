// Trainer <-> the spike detector (operations.md §4, docs/operations.md "Loss and gradient-norm spikes"): each
// completed step's loss and gradient norm (the reduced values every rank holds) are judged against the window; a
// spike is an event line and a warning, and counts in health/loss_spikes_total and health/grad_spikes_total.
#include "train/trainer.h"

namespace mt::train {

Trainer::SpikeStep Trainer::observe_spikes(const StepResult& r) {
    const HealthConfig& h = cfg_.health;
    SpikeStep s;
    if (h.spike_action == "off" || r.skipped) return s;  // an overflow-skipped step's loss is not the model's
    if (!loss_spikes_) {
        loss_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
        grad_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
    }
    s.loss = loss_spikes_->observe(r.loss);
    s.grad = grad_spikes_->observe(r.grad_norm);
    loss_spikes_total_ += s.loss.spike ? 1 : 0;
    grad_spikes_total_ += s.grad.spike ? 1 : 0;
    return s;
}

void Trainer::add_health_metrics(const SpikeStep& s, nlohmann::json& fields) const {
    if (cfg_.health.spike_action == "off") return;
    fields["health/loss_z"] = s.loss.z;
    fields["health/grad_norm_z"] = s.grad.z;
    fields["health/loss_spikes_total"] = loss_spikes_total_;
    fields["health/grad_spikes_total"] = grad_spikes_total_;
}

void Trainer::handle_spike_events(const SpikeStep& s, const StepResult& r) {
    auto event = [&](const char* name, const SpikeVerdict& v, double value) {
        if (!v.spike) return;
        const std::string detail =
            fmt::format("{} {:.6g} at robust z {:.1f} (window median {:.6g}, MAD {:.3g}; health.spike_z = {})",
                        name,
                        value,
                        v.z,
                        v.median,
                        v.mad,
                        cfg_.health.spike_z);
        metrics_->write(step_,
                        "event",
                        {{"event", name},
                         {"value", value},
                         {"z", v.z},
                         {"median", v.median},
                         {"mad", v.mad},
                         {"action", cfg_.health.spike_action},
                         {"detail", detail}});
        if (log_) fmt::print("step {:>6}/{} | warning: {}\n", step_, cfg_.train.steps, detail);
    };
    event("loss_spike", s.loss, r.loss);
    event("grad_spike", s.grad, r.grad_norm);
}

}  // namespace mt::train
