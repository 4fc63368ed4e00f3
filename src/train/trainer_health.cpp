// Trainer <-> bad steps (operations.md §4, docs/operations.md "Bad steps"): the spike detector judges each step's
// loss and gradient norm (the reduced values every rank holds, so every rank decides alike) before the update; a
// spike or a non-finite step then follows health.spike_action: `log` (an event), `skip` (the update is not applied
// and the batch is dropped) or `rollback` (the last checkpoint comes back and the data from it to the bad step is
// dropped). Dropped data is a list of data-step windows: optimizer step s reads data step data_step(s), which the
// manifest of every later checkpoint records, so a resumed run reads the same data.
#include <algorithm>
#include <cmath>
#include <limits>

#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

int64_t Trainer::data_step(int64_t step) const {
    int64_t d = step;
    for (const auto& [first, end] : skipped_data_)  // sorted and disjoint: each window at or before d moves it on
        if (first <= d) d += end - first;
    return d;
}

void Trainer::skip_data(int64_t first, int64_t end) {
    MT_CHECK(0 <= first && first < end, "skip_data: bad window [{}, {})", first, end);
    skipped_data_.emplace_back(first, end);
    std::sort(skipped_data_.begin(), skipped_data_.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& w : skipped_data_)
        if (!merged.empty() && w.first <= merged.back().second)
            merged.back().second = std::max(merged.back().second, w.second);
        else
            merged.push_back(w);
    skipped_data_ = std::move(merged);
    batches_step_ = -1;  // batches read ahead may be the skipped ones
}

void Trainer::apply_fault(StepResult& r) {
    if (!fault_ || fault_->times <= 0 || data_step(step_) != fault_->data_step) return;
    --fault_->times;
    nn::ParamTable& table = model_->params();
    for (int i = 0; i < table.size(); ++i) {
        if (!fault_->spike_param.empty() && table.spec(i).name != fault_->spike_param) continue;
        const core::Tensor g = table.grad(i);
        const core::Tensor host = g.device() == core::Device::cpu ? g : g.to_device(core::Device::cpu);
        MT_CHECK(host.dtype() == core::DType::f32 && host.is_contiguous(), "inject_fault: f32 gradients only");
        float* v = host.data<float>();
        const double spike = fault_->spike_norm / std::sqrt(static_cast<double>(host.numel()));
        for (int64_t k = 0; k < host.numel(); ++k)
            v[k] = fault_->nonfinite              ? std::numeric_limits<float>::quiet_NaN()
                   : !fault_->spike_param.empty() ? static_cast<float>(v[k] + spike)
                                                  : static_cast<float>(v[k] * fault_->grad_scale);
        if (g.device() != core::Device::cpu) g.copy_from(host);
    }
    if (fault_->nonfinite) r.loss = std::numeric_limits<double>::quiet_NaN();
}

void Trainer::observe_spikes(StepResult& r) {
    const HealthConfig& h = cfg_.health;
    if (h.spike_action == "off" || !std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) return;
    if (!loss_spikes_) {
        loss_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
        grad_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
    }
    r.loss_spike = loss_spikes_->observe(r.loss);
    r.grad_spike = grad_spikes_->observe(r.grad_norm);
    loss_spikes_total_ += r.loss_spike.spike ? 1 : 0;
    grad_spikes_total_ += r.grad_spike.spike ? 1 : 0;
    // Only bad steps that are acted on count toward health.max_spikes: under `log` a spike is an event, no more.
    if ((r.loss_spike.spike || r.grad_spike.spike) && h.spike_action != "log") recent_bad_steps_.push_back(step_);
}

bool Trainer::handle_bad_step(StepResult& r, const std::string& reason) {
    const HealthConfig& h = cfg_.health;
    if (reason == "nonfinite") {
        ++nonfinite_total_;
        recent_bad_steps_.push_back(step_);
    }
    r.bad_reason = reason;
    while (!recent_bad_steps_.empty() && recent_bad_steps_.front() <= step_ - h.max_spikes_window)
        recent_bad_steps_.pop_front();
    r.health_stop = h.max_spikes > 0 && static_cast<int64_t>(recent_bad_steps_.size()) > h.max_spikes;
    if (h.spike_action != "skip" && h.spike_action != "rollback") return false;
    // Nothing of the step is applied: the gradients are dropped with the routing counts, the loss scale stays.
    model_->moe_step_discard();
    if (h.spike_action == "rollback" && !last_saved_dir_.empty()) {
        rollback(r);
        return true;
    }
    // skip (or a rollback with no checkpoint yet): the step's data goes, the step counter stays.
    const int64_t d = data_step(step_);
    skip_data(d, d + 1);
    r.dropped_data = {d, d + 1};
    ++bad_steps_skipped_total_;
    r.bad_step = "skipped";
    return true;
}

void Trainer::rollback(StepResult& r) {
    finish_checkpoint_write();  // the checkpoint being written may be the one to return to
    const int64_t bad = data_step(step_), from = data_step(last_saved_step_);
    // What the checkpoint does not know survives it: the windows dropped since, the bad-step history and the
    // counters; the detector's windows come back with it (the data since is gone).
    const nlohmann::json kept = health_checkpoint_json();
    const std::string dir = last_saved_dir_;
    load_checkpoint_state(dir);
    load_health_state(kept, /*windows=*/false);
    skip_data(from, bad + 1);
    r.dropped_data = {from, bad + 1};
    ++rollbacks_total_;
    r.bad_step = "rolled_back";
    r.rolled_back_to = step_;
}

void Trainer::add_health_metrics(const StepResult& r, nlohmann::json& fields) const {
    if (cfg_.health.spike_action == "off") return;
    fields["health/loss_z"] = r.loss_spike.z;
    fields["health/grad_norm_z"] = r.grad_spike.z;
    fields["health/loss_spikes_total"] = loss_spikes_total_;
    fields["health/grad_spikes_total"] = grad_spikes_total_;
    fields["health/nonfinite_total"] = nonfinite_total_;
    fields["health/transient_faults_total"] = transient_faults_total_;
    fields["health/skipped_steps_total"] = bad_steps_skipped_total_;
    fields["health/rollbacks_total"] = rollbacks_total_;
}

void Trainer::add_alarm_metrics(nlohmann::json& fields) const {
    // Every alarm kind's count (operations.md §5): Prometheus's moetrain_alarms_total{kind}.
    std::map<std::string, int64_t> totals;
    for (const char* kind : kTrainerAlarmKinds) totals[kind] = 0;
    totals["loss_spike"] = loss_spikes_total_;
    totals["grad_spike"] = grad_spikes_total_;
    totals["nonfinite"] = nonfinite_total_;
    totals["moe_collapse"] = moe_alarms_total_;
    if (alarms_)
        for (const auto& [kind, n] : alarms_->totals()) totals[kind] = n;
    for (const auto& [kind, n] : totals) fields["alarms/" + kind] = n;
}

void Trainer::handle_alarms(const StepResult& r) {
    const HealthConfig& h = cfg_.health;
    if (!alarms_)
        alarms_.emplace(AlarmConfig{.drift_tv = h.drift_tv,
                                    .drift_window = h.drift_window,
                                    .memory_fraction = h.memory_alarm,
                                    .throughput_ratio = h.throughput_drop,
                                    .straggler_ratio = h.straggler_ratio,
                                    .straggler_window = h.straggler_window,
                                    .warmup = h.spike_warmup});
    std::vector<Alarm> fired;
    auto add = [&](std::vector<Alarm> a) { fired.insert(fired.end(), a.begin(), a.end()); };
    for (const auto& [layer, m] : r.moe) add(alarms_->observe_expert_loads(layer, m.load));
    if (r.mem_reserved_fraction > 0) add(alarms_->observe_memory(r.mem_reserved_fraction));
    if (r.seconds > 0) add(alarms_->observe_throughput(static_cast<double>(tokens_per_step()) / r.seconds));
    // Straggler: each rank's busy time (its step less its waits for the others) next to every other rank's, summed
    // here each step and shared on the steps that write a train line (one small all-reduce per metrics.every steps).
    parallel::Comm& world = mesh_->world();
    if (world.size() > 1) {
        const double waited = comm_seconds_total() - comm_seconds_at_step_start_;  // in every collective of the step
        straggler_busy_seconds_ += std::max(0.0, r.seconds - waited);
        ++straggler_steps_;
        if (step_ % cfg_.metrics.every == 0) {
            std::vector<double> busy(static_cast<size_t>(world.size()), 0.0);
            busy[static_cast<size_t>(world.rank())] = straggler_busy_seconds_ / static_cast<double>(straggler_steps_);
            world.all_reduce(busy.data(), world.size(), parallel::CommType::f64, parallel::ReduceOp::sum).wait();
            add(alarms_->observe_rank_times(busy, straggler_steps_));
            straggler_busy_seconds_ = 0.0, straggler_steps_ = 0;
        }
    }
    for (Alarm& a : fired) {
        a.fields["event"] = a.kind;
        a.fields["alarm"] = true;
        a.fields["detail"] = a.detail;
        metrics_->write(step_, "event", a.fields);
        if (log_) fmt::print("step {:>6}/{} | alarm: {}\n", step_, cfg_.train.steps, a.detail);
    }
}

void Trainer::handle_health_events(const StepResult& r) {
    auto event = [&](const std::string& name, const std::string& detail, nlohmann::json fields) {
        fields["event"] = name;
        fields["detail"] = detail;
        metrics_->write(step_, "event", fields);
        if (log_) fmt::print("step {:>6}/{} | warning: {}\n", step_, cfg_.train.steps, detail);
    };
    auto spike = [&](const char* name, const SpikeVerdict& v, double value) {
        if (!v.spike) return;
        event(name,
              fmt::format("{} {:.6g} at robust z {:.1f} (window median {:.6g}, MAD {:.3g}; health.spike_z = {})",
                          name,
                          value,
                          v.z,
                          v.median,
                          v.mad,
                          cfg_.health.spike_z),
              {{"alarm", true},
               {"value", value},
               {"z", v.z},
               {"median", v.median},
               {"mad", v.mad},
               {"action", cfg_.health.spike_action}});
    };
    spike("loss_spike", r.loss_spike, r.loss);
    spike("grad_spike", r.grad_spike, r.grad_norm);
    if (r.transient_fault) {
        event("transient_fault",
              fmt::format("a non-finite step ran clean when re-run on the same batch (a transient fault: suspect the "
                          "hardware of rank {})",
                          mesh_->world().rank()),
              {{"rank", mesh_->world().rank()}});
    } else if (r.rerun) {
        event("nonfinite",
              fmt::format("a non-finite loss or gradient norm again when re-run on the same batch: a data or model "
                          "fault (health.spike_action = {})",
                          cfg_.health.spike_action),
              {{"alarm", true}, {"action", cfg_.health.spike_action}});
    }
    const nlohmann::json dropped = {r.dropped_data.first, r.dropped_data.second};
    if (r.bad_step == "skipped")
        event("step_skipped",
              fmt::format("{}: the update was not applied and data step {} is dropped (health.spike_action = {})",
                          r.bad_reason,
                          r.dropped_data.first,
                          cfg_.health.spike_action),
              {{"reason", r.bad_reason}, {"dropped_data", dropped}});
    if (r.bad_step == "rolled_back")
        event("rollback",
              fmt::format("{}: back to the checkpoint of step {}; data steps [{}, {}) are dropped",
                          r.bad_reason,
                          step_,
                          r.dropped_data.first,
                          r.dropped_data.second),
              {{"reason", r.bad_reason}, {"resumed_step", step_}, {"dropped_data", dropped}});
    if (!r.health_stop) return;
    save_checkpoint_if_new();
    metrics_->write(step_, "event", {{"event", "health_stop"}, {"reason", r.bad_reason}});
    std::fflush(stdout);
    core::fail_hint(core::ExitCode::health,
                    "look at the loss_spike / grad_spike / nonfinite events in metrics.jsonl; raise health.max_spikes "
                    "or health.spike_z to keep training",
                    "{} bad steps within {} steps (health.max_spikes = {}): checkpoint saved, stopping [{}]",
                    recent_bad_steps_.size(),
                    cfg_.health.max_spikes_window,
                    cfg_.health.max_spikes,
                    cfg_.source);
}

nlohmann::json Trainer::health_checkpoint_json() const {
    nlohmann::json j = {{"skipped_data", skipped_data_},
                        {"recent_bad_steps", std::vector<int64_t>(recent_bad_steps_.begin(), recent_bad_steps_.end())},
                        {"totals",
                         {loss_spikes_total_,
                          grad_spikes_total_,
                          nonfinite_total_,
                          transient_faults_total_,
                          bad_steps_skipped_total_,
                          rollbacks_total_}}};
    if (loss_spikes_) j["loss_window"] = loss_spikes_->state_json(), j["grad_window"] = grad_spikes_->state_json();
    return j;
}

void Trainer::load_health_checkpoint(const nlohmann::json& manifest) {
    skipped_data_.clear();
    recent_bad_steps_.clear();
    loss_spikes_.reset();
    grad_spikes_.reset();
    loss_spikes_total_ = grad_spikes_total_ = nonfinite_total_ = transient_faults_total_ = 0;
    bad_steps_skipped_total_ = rollbacks_total_ = 0;
    // A checkpoint from before bad-step handling: nothing was dropped, nothing judged.
    if (manifest.contains("health")) load_health_state(manifest.at("health"), /*windows=*/true);
}

void Trainer::load_health_state(const nlohmann::json& j, bool windows) {
    try {
        skipped_data_.clear();
        for (const auto& w : j.at("skipped_data")) skip_data(w.at(0).get<int64_t>(), w.at(1).get<int64_t>());
        recent_bad_steps_.clear();
        for (const auto& s : j.at("recent_bad_steps")) recent_bad_steps_.push_back(s.get<int64_t>());
        const auto totals = j.at("totals").get<std::vector<int64_t>>();
        if (totals.size() != 6) throw std::runtime_error("\"totals\" needs 6 counters");
        loss_spikes_total_ = totals[0], grad_spikes_total_ = totals[1], nonfinite_total_ = totals[2];
        transient_faults_total_ = totals[3], bad_steps_skipped_total_ = totals[4], rollbacks_total_ = totals[5];
    } catch (const std::exception& e) {
        core::fail(core::ExitCode::checkpoint, "manifest field \"health\" is malformed: {}", e.what());
    }
    if (!windows || !j.contains("loss_window")) return;
    const HealthConfig& h = cfg_.health;
    loss_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
    grad_spikes_.emplace(h.spike_window, h.spike_z, h.spike_warmup);
    loss_spikes_->load_state_json(j.at("loss_window"));
    grad_spikes_->load_state_json(j.at("grad_window"));
}

}  // namespace mt::train
