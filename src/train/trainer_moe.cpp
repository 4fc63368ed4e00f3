// Trainer <-> MoE layers: the per-layer routing metrics in the JSONL, the routing-collapse alarm (an event line, a
// counter, and with moe.alarm.action = "stop" a checkpoint and exit 7), and the balancer state in checkpoints.
#include <algorithm>
#include <cstdio>

#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// "l03": the layer label of the metric keys (conventions §7.1: "moe/max_vio/l03").
std::string layer_label(int64_t layer) {
    return fmt::format("l{:02d}", layer);
}

}  // namespace

double moe_max_vio(const StepResult& r) {
    double worst = 0.0;
    for (const auto& [layer, m] : r.moe) worst = std::max(worst, m.max_vio);
    return worst;
}

void Trainer::add_moe_metrics(const StepResult& r, nlohmann::json& fields) const {
    if (r.moe.empty()) return;
    const int64_t every = cfg_.moe.log_loads_every;
    const bool with_load = every > 0 && step_ % every == 0;
    // Image + text batches: each layer's per-modality metrics too (multimodal.md §4), "moe/modality/image/max_vio/l03".
    const bool modalities = cfg_.data.images();
    const bool with_drop = cfg_.model.moe.capacity_factor > 0;
    double load_var = 0.0, drop_rate = 0.0;
    for (const auto& [layer, m] : r.moe) {
        nlohmann::json layer_fields = m.to_json(with_load);
        if (modalities) layer_fields.update(m.modality_json(with_load, with_drop));
        for (auto it = layer_fields.begin(); it != layer_fields.end(); ++it)
            fields["moe/" + it.key() + "/" + layer_label(layer)] = it.value();
        load_var = std::max(load_var, m.load_var);
        drop_rate += m.drop_rate / static_cast<double>(r.moe.size());
    }
    // Model-wide summaries: the worst layer's balance and the mean drop rate.
    fields["moe/max_vio"] = moe_max_vio(r);
    fields["moe/load_var"] = load_var;
    fields["moe/drop_rate"] = drop_rate;
    fields["moe/collapse_alarms_total"] = moe_alarms_total_;
    if (cfg_.model.moe.balance.mode == nn::MoeBalanceMode::aux_loss) fields["aux_loss"] = r.aux_loss;
}

void Trainer::handle_moe_events(const StepResult& r) {
    const auto layers = model_->moe_layers();
    bool stop = false;
    for (size_t i = 0; i < layers.size(); ++i) {
        const auto& [layer, moe] = layers[i];
        const nn::MoeStepMetrics& m = r.moe.at(i).second;
        // The two warnings of moe.md §4, written when they start (not every step while they hold).
        auto warn = [&](const char* event, bool now, bool& before, double value) {
            if (now && !before) {
                const std::string detail = fmt::format("{} = {:.4g} in layer {}", event, value, layer);
                metrics_->write(step_, "event", {{"event", event}, {"layer", layer}, {"detail", detail}});
                if (log_) fmt::print("step {:>6}/{} | warning: {}\n", step_, cfg_.train.steps, detail);
            }
            before = now;
        };
        auto& flags = moe_warning_flags_[layer];
        warn("moe_imbalance_warning", m.imbalance_warning, flags.first, m.load_var);
        warn("moe_bias_range_warning", m.bias_range_warning, flags.second, m.bias_range);
        // The layer's alarm over all tokens, then each modality's over its own rows (multimodal.md §4).
        std::vector<nn::MoeCollapseEvent> alarms = moe->last_modality_alarms();
        if (moe->last_alarm()) alarms.insert(alarms.begin(), *moe->last_alarm());
        for (const nn::MoeCollapseEvent& alarm : alarms) {
            ++moe_alarms_total_;
            nlohmann::json fields = alarm.to_json();
            fields["layer"] = layer;
            fields["detail"] = alarm.message();
            fields["alarms_total"] = moe_alarms_total_;
            fields["alarm"] = true;
            metrics_->write(step_, "event", fields);
            if (log_)
                fmt::print("step {:>6}/{} | ALARM routing collapse in layer {}: {}\n",
                           step_,
                           cfg_.train.steps,
                           layer,
                           alarm.message());
            stop = stop || cfg_.moe.alarm_action == "stop";
        }
    }
    if (!stop) return;
    save_checkpoint();
    std::fflush(stdout);
    core::fail_hint(core::ExitCode::health,
                    "inspect the moe/* metrics in metrics.jsonl; set moe.alarm.action = \"log\" to keep training",
                    "routing collapse at step {} (moe.alarm.action = \"stop\"): checkpoint saved, stopping [{}]",
                    step_,
                    cfg_.source);
}

std::vector<CheckpointTensor> Trainer::moe_checkpoint_tensors() {
    std::vector<CheckpointTensor> tensors;
    for (auto& [layer, moe] : model_->moe_layers())
        for (auto& [name, t] : moe->state_tensors()) tensors.push_back({name, "balancer", t});
    return tensors;
}

nlohmann::json Trainer::moe_checkpoint_json() {
    nlohmann::json j = nlohmann::json::object();
    for (auto& [layer, moe] : model_->moe_layers()) {
        nlohmann::json state = {{"alarm", moe->collapse_detector().state_json()}};
        if (moe->per_modality()) state["modality_alarms"] = moe->modality_alarm_state_json();
        j[fmt::format("layers.{}.moe", layer)] = state;
    }
    return j;
}

void Trainer::load_moe_checkpoint(const Checkpoint& ckpt) {
    const nlohmann::json saved = ckpt.manifest().value("moe", nlohmann::json::object());
    for (auto& [layer, moe] : model_->moe_layers()) {
        std::vector<std::pair<std::string, core::Tensor>> tensors;
        for (auto& [name, t] : moe->state_tensors()) tensors.emplace_back(name, ckpt.read("balancer", name));
        moe->load_state_tensors(tensors);
        const std::string key = fmt::format("layers.{}.moe", layer);
        if (!saved.contains(key))
            core::fail(core::ExitCode::checkpoint,
                       "checkpoint manifest has no MoE state for {} (\"moe\" in manifest.json) [{}]",
                       key,
                       ckpt.dir());
        moe->collapse_detector().load_state_json(saved.at(key).at("alarm"));
        // The per-modality detectors (image + text models); a checkpoint from before them starts their streaks anew.
        if (moe->per_modality() && saved.at(key).contains("modality_alarms"))
            moe->load_modality_alarm_state_json(saved.at(key).at("modality_alarms"));
    }
}

}  // namespace mt::train
