// Trainer state -> checkpoint: parameters, AdamW and Muon state, step, data position and RNG seed, written blocking
// or from a background thread (the load and resume: trainer_resume.cpp).
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/clock.h"
#include "ops/global_norm.h"
#include "parallel/comm.h"
#include "train/async_checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/config_drift.h"
#include "train/trainer.h"
#include "train/trainer_checkpoint_parts.h"

namespace mt::train {

namespace checkpoint_parts {

// Every tensor of the whole model at its global shape, whatever part of it this rank holds (a pipeline stage holds
// only its layers): the checkpoint's signature is the model's, not the layout's.
std::vector<TensorSpec> model_specs(const nn::ModelConfig& model, const nn::ParamTable& table) {
    const nn::ParamTable whole = nn::Model::param_layout(model, table.precision());
    std::vector<TensorSpec> specs;
    for (int i = 0; i < whole.size(); ++i)
        specs.push_back({whole.spec(i).name, nn::param_global_shape(whole.spec(i)), table.precision().master});
    return specs;
}

std::string checkpoints_root(const JobConfig& cfg) {
    return cfg.run.dir + "/checkpoints";
}

// Checkpoints hold host copies, so a checkpoint written on a GPU resumes on the CPU and the other way.
core::Tensor to_host(const core::Tensor& t) {
    return t.device() == core::Device::cpu ? t : t.to_device(core::Device::cpu);
}

core::Tensor flat(const core::Tensor& t) {
    return t.reshape({t.numel()});
}

// A piece's two AdamW moments with their checkpoint kinds.
std::array<std::pair<const char*, core::Tensor>, 2> moments(const optim::AdamW& adamw, const optim::AdamW::Piece& p) {
    return {{{"adamw.m", adamw.m(p)}, {"adamw.v", adamw.v(p)}}};
}

}  // namespace checkpoint_parts

using namespace checkpoint_parts;

namespace {

// Tensor parallelism: a flat range [begin, end) of a tp-split parameter's local shard (1-D or 2-D) as boxes of the
// global tensor, each with the local flat index of its first element: a partial first row, a slab of whole rows, a
// partial last row, less the padding of a vocabulary's last shard. (A row-parallel shard's rows are not runs of the
// global tensor, so a ZeRO-1 slice of it is not one flat range.)
struct TpBox {
    core::Shape offset, extent;
    int64_t local_begin = 0;
};
std::vector<TpBox> tp_boxes(const nn::ParamSpec& spec, int64_t begin, int64_t end) {
    MT_CHECK(spec.shape.size() <= 2, "tp checkpoint boxes of a {}-D parameter ({})", spec.shape.size(), spec.name);
    const bool matrix = spec.shape.size() == 2;
    const int64_t cols = matrix ? spec.shape[1] : 1, real = nn::param_tp_real(spec);
    // Real rows and columns of the local shard.
    const int64_t rows_real = spec.tp_axis == 0 ? real : spec.shape[0];
    const int64_t cols_real = matrix && spec.tp_axis == 1 ? real : cols;
    std::vector<TpBox> boxes;
    auto emit = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {  // local rows [r0, r1), columns [c0, c1)
        r1 = std::min(r1, rows_real), c1 = std::min(c1, cols_real);
        if (r0 >= r1 || c0 >= c1) return;
        TpBox b{.offset = {r0}, .extent = {r1 - r0}, .local_begin = r0 * cols + c0};
        if (matrix) b.offset.push_back(c0), b.extent.push_back(c1 - c0);
        b.offset[static_cast<size_t>(spec.tp_axis)] += spec.tp_first;
        boxes.push_back(std::move(b));
    };
    if (begin >= end) return boxes;
    const int64_t first = begin / cols, last = (end - 1) / cols;  // the rows the range touches
    if (first == last) {
        emit(first, first + 1, begin % cols, (end - 1) % cols + 1);
        return boxes;
    }
    int64_t lo = first, hi = last + 1;
    if (begin % cols != 0) emit(first, first + 1, begin % cols, cols), lo = first + 1;
    if (end % cols != 0) hi = last;
    emit(lo, hi, 0, cols);
    if (end % cols != 0) emit(last, last + 1, 0, end % cols);
    return boxes;
}

}  // namespace

void Trainer::save_checkpoint() {
    write_checkpoint(/*async=*/false);
}

// What this rank's checkpoint file holds, in a fixed order (the snapshot buffers are matched by position).
std::vector<CheckpointTensor> Trainer::checkpoint_tensors() {
    // Every rank writes what it alone holds and each replicated tensor is written once (conventions §5.2): dense
    // parameters by the first rank of dp_span, this rank's experts by the first rank of its edp group (as a box of
    // the global tensor), the AdamW moments with their parameters, or under ZeRO-1 by their owners (flat ranges),
    // and the MoE balancer state (the same on every rank) by world rank 0.
    nn::ParamTable& table = model_->params();
    // Whether this rank writes a replicated parameter: the first of the ranks holding the same copy (a tp-split one
    // is this rank's own box; one replicated over tp is written by tp rank 0).
    const bool first_data = mesh_->group(parallel::MeshGroup::dp_span).rank() == 0;
    const bool first_expert = mesh_->group(parallel::MeshGroup::edp).rank() == 0;
    const bool first_tp = mesh_->coord(parallel::MeshAxis::tp) == 0;
    // A tied embedding's second copy (the last pipeline stage's) is never written: the first stage's is the tensor.
    const bool tied_copy = tied_embedding_ && mesh_->coord(parallel::MeshAxis::pp) != 0;
    // A replicated key/value head is written by the first of the tp ranks holding it.
    auto first_replica = [&](const nn::ParamSpec& spec) {
        return mesh_->coord(parallel::MeshAxis::tp) % spec.tp_replicas == 0;
    };
    auto replica_writer = [&](const nn::ParamSpec& spec) {
        if (tied_copy && spec.name == "embed.weight") return false;
        if (!first_replica(spec)) return false;
        if (nn::param_expert_sharded(spec)) return first_expert;
        return first_data && (first_tp || nn::param_tp_split(spec));
    };
    // Under ZeRO-1 each owned slice is written by its owner; a parameter replicated over tp (but not reduced over
    // it) has the same owned slices on every tp rank.
    auto owner_writes = [&](const nn::ParamSpec& spec) {
        if (tied_copy && spec.name == "embed.weight") return false;
        if (!first_replica(spec)) return false;
        return first_tp || nn::param_tp_split(spec) || spec.tp_partial_grad || nn::param_expert_sharded(spec);
    };
    std::vector<CheckpointTensor> tensors;
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (!replica_writer(spec)) continue;
        const nn::ParamBox box = nn::param_box(spec);
        core::Tensor mine = table.master(i);
        if (nn::param_tp_split(spec)) mine = to_host(mine).slice(spec.tp_axis, 0, nn::param_tp_real(spec)).clone();
        tensors.push_back({spec.name, "param", mine, nn::param_global_shape(spec), box.offset});
    }
    for (const optim::AdamW::Piece& p : adamw_->pieces()) {
        const nn::ParamSpec& spec = table.spec(p.param);
        if (adamw_->sharded() ? !owner_writes(spec) : !replica_writer(spec)) continue;
        for (const auto& [kind, state] : moments(*adamw_, p)) {
            if (!nn::param_tp_split(spec)) {
                const int64_t at = nn::param_shard_flat_offset(spec) + p.begin;
                tensors.push_back({spec.name, kind, state, nn::param_global_shape(spec), {}, at});
                continue;
            }
            const core::Tensor host = to_host(state);
            for (const TpBox& b : tp_boxes(spec, p.begin, p.end)) {
                const int64_t first = b.local_begin - p.begin;
                const core::Tensor part =
                    b.extent.size() == 2 && b.extent[0] > 1
                        ? host.slice(0, first, first + b.extent[0] * spec.shape[1])
                              .reshape({b.extent[0], spec.shape[1]})
                              .slice(1, 0, b.extent[1])
                              .clone()
                        : host.slice(0, first, first + core::shape_numel(b.extent)).reshape(b.extent).clone();
                tensors.push_back({spec.name, kind, part, nn::param_global_shape(spec), b.offset});
            }
        }
    }
    // Muon's momentum at its place in the parameter's global tensor, a run of consecutive matrices per entry:
    // replicated, written as the parameter is; under whole-matrix ownership by each matrix's owner.
    if (muon_)
        for (const optim::Muon::Entry& e : muon_->entries()) {
            const nn::ParamSpec& spec = table.spec(e.param);
            if (grad_sync_->owns_matrices() ? !owner_writes(spec) : !replica_writer(spec)) continue;
            if (nn::param_tp_split(spec)) {  // a tp shard of a 2-D weight: its box, as the parameter's
                if (!e.writer.front()) continue;
                tensors.push_back({spec.name,
                                   "muon.momentum",
                                   to_host(e.momentum.reshape(spec.shape)).clone(),
                                   nn::param_global_shape(spec),
                                   nn::param_box(spec).offset});
                continue;
            }
            optim::for_each_matrix_run(e, true, [&](int64_t first, int64_t count, int64_t at) {
                const core::Tensor m = e.momentum.slice(0, at, at + count);
                tensors.push_back({spec.name,
                                   "muon.momentum",
                                   m.reshape({m.numel()}),
                                   nn::param_global_shape(spec),
                                   {},
                                   nn::param_shard_flat_offset(spec) + first * m.numel() / count});
            });
        }
    // Gradient compression's error-feedback state, per rank (it does not reshard: conventions §5.2).
    for (const parallel::CompressedReduce::State& st : grad_sync_->compress_states())
        tensors.push_back(
            {compress_state_name(st),
             "ef",
             core::Tensor::borrow(st.values.data(), {static_cast<int64_t>(st.values.size())}, core::DType::f32)});
    // The balancer state is the same on every rank of a stage: its first rank writes its stage's layers.
    if (mesh_->group(parallel::MeshGroup::stage).rank() == 0)
        for (auto& moe : moe_checkpoint_tensors()) tensors.push_back({moe.name, moe.kind, moe.tensor});
    return tensors;
}

void Trainer::reserve_checkpoint_buffers() {
    // Only when a checkpoint before the run's last (which is written blocking) will be a background one. On the CPU
    // too: the buffers are the same size there, and the first checkpoint then allocates nothing either.
    const int64_t every = cfg_.checkpoint.every_steps;
    if (!cfg_.checkpoint.async || every <= 0 || cfg_.train.steps <= every) return;
    const auto start = std::chrono::steady_clock::now();
    if (!async_writer_) async_writer_ = std::make_unique<AsyncCheckpointWriter>();
    std::vector<core::Tensor> likes;
    for (const CheckpointTensor& t : checkpoint_tensors()) likes.push_back(t.tensor);
    // Pinning a GPU run's copy of the state (tens of GB, seconds) runs beside the start, the resume and the first
    // steps; the first checkpoint waits for it if it has not finished. The config line says how long the start
    // itself waited.
    async_writer_->reserve_in_background(likes);
    checkpoint_reserve_seconds_ = core::seconds_since(start);
}

void Trainer::write_checkpoint(bool async) {
    finish_checkpoint_write();  // a checkpoint waits for the one before it
    if (async && async_writer_) {
        // Snapshot buffers that could not be had (reserve_checkpoint_buffers): blocking checkpoints instead, on
        // every rank alike (the two kinds take different collectives).
        const std::string& failure = async_writer_->reservation_failure();
        parallel::Comm& world = mesh_->world();
        const int64_t failed = failure.empty() ? 0 : 1;
        if ((world.size() > 1 ? parallel::comm_all_reduce_max(world, failed) : failed) != 0) {
            if (log_ && !checkpoint_blocking_fallback_)
                fmt::print(
                    "moetrain: warning: the asynchronous checkpoints' snapshot buffers could not be allocated "
                    "({}): checkpoints are written blocking from here on\n",
                    failure.empty() ? "on another rank" : failure);
            checkpoint_blocking_fallback_ = true;
            async = false;
        }
    }
    beat_phase(Phase::checkpoint);
    const auto start = std::chrono::steady_clock::now();
    grad_sync_->gather_master();  // ZeRO-1 keeps the master weights sharded between checkpoints (and gathers
                                  // the forward's weights in the background)
    std::vector<CheckpointTensor> tensors = checkpoint_tensors();
    nlohmann::json moe_state = moe_checkpoint_json();
    if (pipelined())  // every stage's layers into rank 0's manifest
        for (const std::string& part : parallel::comm_gather_strings(mesh_->world(), moe_state.dump()))
            moe_state.update(nlohmann::json::parse(part));
    const auto& t = cfg_.train;
    // The data position is the next step's data step: past the windows bad steps dropped (trainer_health.cpp).
    const int64_t next_data = data_step(step_);
    const int64_t samples = data::sampler_first_sample(next_data, t.grad_accum, 0, data_size(), 0, t.batch_size);
    nlohmann::json ranks = nlohmann::json::array();
    for (int64_t r = 0; r < data_size(); ++r) {
        const int64_t first = data::sampler_first_sample(next_data, t.grad_accum, 0, data_size(), r, t.batch_size);
        ranks.push_back({{"dp", r},
                         {"source", "train"},
                         {"epoch", train_sampler_ ? train_sampler_->epoch_of(first) : 0},
                         {"sample", first}});
    }
    nlohmann::json extra = {
        {"config_toml", cfg_.to_toml()},
        {"model_signature", model_signature(model_specs(cfg_.model, model_->params()))},
        {"tokens_seen", tokens_seen(step_)},
        {"mesh", mesh_->to_json()},
        {"rng", {{"seed", cfg_.run.seed}, {"step", step_}}},
        {"loss_scaler", scaler_.state()},
        {"moe", moe_state},
        {"data", {{"samples_consumed", samples}, {"ranks", ranks}}},
        {"health", health_checkpoint_json()},
    };
    extra["data"].update(long_checkpoint_json());  // the curriculum stage and position, when there is one
    if (weighting_) extra["loss_weighting"] = weighting_->state();  // s_i and moments, or DWA's windows
    const RetentionPolicy keep{.keep_last = cfg_.checkpoint.keep_last, .keep_every = cfg_.checkpoint.keep_every};
    checkpoint_prepare_seconds_ = core::seconds_since(start);
    if (async) {
        // The loop waits only for the copies; the file is written while the next steps run.
        if (!async_writer_) async_writer_ = std::make_unique<AsyncCheckpointWriter>();
        for (size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor = async_writer_->snapshot(i, tensors[i].tensor);
        checkpoint_copy_seconds_ = core::seconds_since(start) - checkpoint_prepare_seconds_;
        async_writer_->start(checkpoints_root(cfg_), step_, std::move(tensors), extra, keep, &mesh_->world());
        checkpoint_blocking_seconds_ = core::seconds_since(start);
        return;
    }
    for (CheckpointTensor& c : tensors) c.tensor = to_host(c.tensor);
    checkpoint_copy_seconds_ = core::seconds_since(start) - checkpoint_prepare_seconds_;
    const std::string dir = checkpoint_write(checkpoints_root(cfg_), step_, tensors, extra, keep, &mesh_->world());
    checkpoint_blocking_seconds_ = core::seconds_since(start);
    checkpoint_saved(dir, step_, checkpoint_blocking_seconds_, checkpoint_blocking_seconds_, false);
}

void Trainer::checkpoint_saved(const std::string& dir, int64_t step, double blocking, double write, bool async) {
    last_saved_step_ = step;
    last_saved_dir_ = dir;
    if (log_)
        fmt::print("step {:>6}/{} | checkpoint {} ({}{:.2f} s{})\n",
                   step_,
                   cfg_.train.steps,
                   dir,
                   async ? "written in the background in " : "",
                   write,
                   async ? fmt::format("; the loop waited {:.3f} s", blocking) : "");
    if (metrics_)
        metrics_->write(step_,
                        "event",
                        {{"event", "checkpoint"},
                         {"checkpoint_step", step},
                         {"dir", dir},
                         {"async", async},
                         {"blocking_seconds", blocking},
                         {"write_seconds", write},
                         // the snapshot buffers' background reservation: its time, and the snapshot copies' wait for it
                         // (a part of copy_seconds)
                         {"reservation_seconds", async_writer_ ? async_writer_->reservation_seconds() : 0.0},
                         {"reservation_wait_seconds", async_writer_ ? async_writer_->reservation_wait_seconds() : 0.0},
                         // The loop's wait in the checkpoint call, by phase (async: prepare, snapshot copies, start;
                         // blocking: prepare, device-to-host copies, the write), beside blocking_seconds, which
                         // adds an async checkpoint's wait at its end.
                         {"phases",
                          {{"prepare_seconds", checkpoint_prepare_seconds_},
                           {"copy_seconds", checkpoint_copy_seconds_},
                           {"start_or_write_seconds",
                            checkpoint_blocking_seconds_ - checkpoint_prepare_seconds_ - checkpoint_copy_seconds_}}}});
}

void Trainer::finish_checkpoint_write() {
    if (!async_writer_ || !async_writer_->in_flight()) return;
    beat_phase(Phase::checkpoint);
    const std::string dir = async_writer_->finish();
    checkpoint_saved(dir,
                     async_writer_->step(),
                     checkpoint_blocking_seconds_ + async_writer_->wait_seconds(),
                     async_writer_->write_seconds(),
                     true);
}

void Trainer::poll_checkpoint_write() {
    if (!async_writer_ || !async_writer_->in_flight()) return;
    // Finished only when every rank's file is in: the ranks agree first (a rank still writing makes all go on).
    parallel::Comm& world = mesh_->world();
    const int64_t writing = async_writer_->file_done() ? 0 : 1;
    if ((world.size() > 1 ? parallel::comm_all_reduce_max(world, writing) : writing) == 0) finish_checkpoint_write();
}

}  // namespace mt::train
