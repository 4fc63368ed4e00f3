// Trainer <-> device memory: each step's mem/* metrics from the backend's statistics (core/backend.h), the bytes of
// the state the trainer holds for the whole run (so that the rest of the peak, the activations, can be told apart),
// and a warning event when the memory reserved nears the device's total; and whether the steps run as CUDA graphs
// (whose scratch the backend keeps in a pool of their own).
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <set>
#include <string>

#include "core/backend.h"
#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::setup_cuda_graphs() {
    if (!cfg_.train.cuda_graphs) return;
    std::string blocker = mesh_->world().size() > 1 ? "more than one process (the gradient reduction's hooks)" : "";
    if (blocker.empty()) blocker = model_->graph_blocker();
    if (blocker.empty()) {
        model_->set_cuda_graphs(true);
        return;
    }
    if (log_) fmt::print("moetrain: train.cuda_graphs: the training steps run without CUDA graphs here: {}\n", blocker);
}

int64_t Trainer::state_bytes() const {
    // Each arena once (without an fp32 master copy the master weights are the forward's weights: one storage), and
    // only those on the model's device (under optimizer offload the master weights and moments are host memory).
    const nn::ParamTable& table = model_->params();
    std::set<const core::Storage*> seen;
    int64_t bytes = adamw_->device_state_bytes();
    for (const core::Tensor& arena : {table.param_arena(), table.master_arena(), table.grad_arena()})
        if (arena.defined() && arena.device() == table.precision().device && seen.insert(arena.storage().get()).second)
            bytes += static_cast<int64_t>(arena.storage()->bytes());
    return bytes;
}

void Trainer::memory_step_begin() {
    core::backend_get(model_->params().precision().device).reset_peak();
}

void Trainer::memory_step_end(StepResult& r) {
    const core::Backend& backend = core::backend_get(model_->params().precision().device);
    // The peak is at least what is held now. The CUDA allocator's counters keep that exactly; the kernel's RSS
    // counters are approximate (per-CPU batches), so on the CPU a high-water mark read after the RSS can come out a
    // few pages below it.
    const auto allocated = static_cast<double>(backend.bytes_in_use());
    const auto reserved = static_cast<double>(backend.reserved_bytes());
    const auto peak = std::max(static_cast<double>(backend.peak_bytes()), allocated);
    const auto total = static_cast<double>(backend.total_bytes());
    // Each figure's largest over the ranks (one reduction): the rank nearest its device's limit is the one that
    // matters. Doubles hold byte counts exactly up to 2^53.
    std::array<double, 5> v = {
        allocated, reserved, peak, peak - static_cast<double>(state_bytes()), total > 0 ? reserved / total : 0.0};
    if (pipelined()) {  // each stage's own peak (the stages hold different layers)
        std::vector<double> stages(static_cast<size_t>(mesh_->size(parallel::MeshAxis::pp)));
        mesh_->group(parallel::MeshGroup::pp).all_gather(&peak, stages.data(), 1, parallel::CommType::f64).wait();
        r.pp_stage_mem_peak.assign(stages.begin(), stages.end());
    }
    parallel::Comm& world = mesh_->world();
    if (world.size() > 1)
        world.all_reduce(v.data(), static_cast<int64_t>(v.size()), parallel::CommType::f64, parallel::ReduceOp::max)
            .wait();
    r.mem_allocated = static_cast<int64_t>(v[0]);
    r.mem_reserved = static_cast<int64_t>(v[1]);
    r.mem_peak = static_cast<int64_t>(v[2]);
    r.mem_peak_activations = static_cast<int64_t>(v[3]);
    r.mem_reserved_fraction = v[4];
}

void Trainer::add_memory_metrics(const StepResult& r, nlohmann::json& fields) const {
    fields["mem/allocated"] = r.mem_allocated;
    fields["mem/reserved"] = r.mem_reserved;
    fields["mem/peak"] = r.mem_peak;
    fields["mem/peak_activations"] = r.mem_peak_activations;
}

void Trainer::handle_memory_events(const StepResult& r) {
    // Once per crossing, as the MoE warnings: written at the step the fraction goes above the threshold, and again
    // only after it has been at or below it for a step.
    const bool now = r.mem_reserved_fraction > cfg_.metrics.memory_warning;
    if (now && !memory_warning_on_) {
        const bool gpu = model_->params().precision().device == core::Device::cuda;
        const std::string detail = fmt::format(
            "{} memory reserved {:.1f} GB is {:.1f}% of the {}'s memory (above metrics.memory_warning = {})",
            gpu ? "device" : "process",
            static_cast<double>(r.mem_reserved) / 1e9,
            100.0 * r.mem_reserved_fraction,
            gpu ? "GPU" : "machine",
            cfg_.metrics.memory_warning);
        metrics_->write(step_,
                        "event",
                        {{"event", "memory_warning"},
                         {"reserved", r.mem_reserved},
                         {"fraction", r.mem_reserved_fraction},
                         {"detail", detail}});
        if (log_) fmt::print("step {:>6}/{} | warning: {}\n", step_, cfg_.train.steps, detail);
    }
    memory_warning_on_ = now;
}

}  // namespace mt::train
