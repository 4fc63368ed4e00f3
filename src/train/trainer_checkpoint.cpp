// Trainer state <-> checkpoint: parameters, AdamW moments, step, data position and RNG seed; exact resume.
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "ops/global_norm.h"
#include "parallel/comm.h"
#include "train/async_checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/config_drift.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// A checkpoint that is damaged (unreadable, truncated, a CRC-32C mismatch, a non-finite value), as opposed to one
// that does not fit this run: resume_latest falls back to an older one for these only.
class CheckpointCorrupt : public core::Error {
   public:
    explicit CheckpointCorrupt(const core::Error& e) : core::Error(e) {}
};

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

void read_to_device(const Checkpoint& ckpt, const std::string& kind, const std::string& name, const core::Tensor& dst) {
    if (dst.device() == core::Device::cpu) return ckpt.read_into(kind, name, dst);
    // Straight from the file's mapping (read_flat's staged copy) where the layout allows, not through a host copy.
    if (dst.is_contiguous() && ckpt.global_shape(kind, name) == dst.shape())
        return ckpt.read_flat(kind, name, 0, dst.reshape({dst.numel()}));
    const core::Tensor host = core::Tensor::zeros(dst.shape(), dst.dtype());
    ckpt.read_into(kind, name, host);
    dst.copy_from(host);
}

// Elements [begin, begin + n) of a saved tensor's flattened global form into dst ([n], any device): a rank's part
// of an expert-sharded parameter or of ZeRO state, read without loading the whole tensor. The checkpoint may have
// been written by any mesh, but the tensor must have the model's global shape.
void read_flat_part(const Checkpoint& ckpt,
                    const std::string& kind,
                    const std::string& name,
                    const core::Shape& global,
                    int64_t begin,
                    const core::Tensor& dst) {
    if (ckpt.global_shape(kind, name) != global)
        core::fail(core::ExitCode::checkpoint,
                   "tensor {} ({}) has shape {} in the checkpoint but {} in the model [{}]",
                   name,
                   kind,
                   core::shape_str(ckpt.global_shape(kind, name)),
                   core::shape_str(global),
                   ckpt.dir());
    ckpt.read_flat(kind, name, begin, dst);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

core::Tensor flat(const core::Tensor& t) {
    return t.reshape({t.numel()});
}

// A loaded weight or moment must be finite: a flipped exponent bit that the CRC did not catch (verification off)
// would otherwise resume into a run that diverges a few steps later.
// seconds: the check's wall time is added to it (the `resumed` event's load_check_seconds).
void check_finite(
    const core::Tensor& t, const std::string& name, const std::string& kind, const std::string& dir, double& seconds) {
    if (t.dtype() != core::DType::f32) return;
    const auto start = std::chrono::steady_clock::now();
    struct AddTime {
        std::chrono::steady_clock::time_point start;
        double& to;
        ~AddTime() {
            to += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
    } add_time{start, seconds};
    // On a device, its sum of squares first (f64, on the device: a non-finite element makes it non-finite): only
    // then is the tensor copied to the host to find the element, so a resume does not copy its whole state back.
    if (t.device() != core::Device::cpu && t.is_contiguous() && std::isfinite(ops::global_norm_sq(t))) return;
    const core::Tensor host = t.is_contiguous() ? to_host(t) : to_host(t).clone();
    const float* v = host.data<float>();
    for (int64_t i = 0; i < host.numel(); ++i)
        if (!std::isfinite(v[i]))
            core::fail_hint(
                core::ExitCode::checkpoint,
                "resume from an older checkpoint (delete this step directory) or restore it from a backup",
                "tensor {} ({}) holds a non-finite value ({}) at element {}: the checkpoint is corrupt [{}]",
                name,
                kind,
                v[i],
                i,
                dir);
}

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

// This rank's shard of a tp-split tensor read from the checkpoint's global one (zeros in a padded shard's tail).
core::Tensor read_tp_shard(const Checkpoint& ckpt, const std::string& kind, const nn::ParamSpec& spec, core::DType dt) {
    const core::Shape global = nn::param_global_shape(spec);
    if (ckpt.global_shape(kind, spec.name) != global)
        core::fail(core::ExitCode::checkpoint,
                   "tensor {} ({}) has shape {} in the checkpoint but {} in the model [{}]",
                   spec.name,
                   kind,
                   core::shape_str(ckpt.global_shape(kind, spec.name)),
                   core::shape_str(global),
                   ckpt.dir());
    const core::Tensor whole = core::Tensor::zeros(global, dt);
    ckpt.read_into(kind, spec.name, whole);
    const core::Tensor shard = core::Tensor::zeros(spec.shape, dt);
    const nn::ParamBox box = nn::param_box(spec);
    core::Tensor src = whole, dst = shard;
    for (size_t d = 0; d < box.offset.size(); ++d) {
        src = src.slice(static_cast<int>(d), box.offset[d], box.offset[d] + box.extent[d]);
        dst = dst.slice(static_cast<int>(d), 0, box.extent[d]);
    }
    dst.copy_from(src);
    return shard;
}

// A piece's two AdamW moments with their checkpoint kinds.
std::array<std::pair<const char*, core::Tensor>, 2> moments(const optim::AdamW& adamw, const optim::AdamW::Piece& p) {
    return {{{"adamw.m", adamw.m(p)}, {"adamw.v", adamw.v(p)}}};
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
    checkpoint_reserve_seconds_ = seconds_since(start);
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
    checkpoint_prepare_seconds_ = seconds_since(start);
    if (async) {
        // The loop waits only for the copies; the file is written while the next steps run.
        if (!async_writer_) async_writer_ = std::make_unique<AsyncCheckpointWriter>();
        for (size_t i = 0; i < tensors.size(); ++i) tensors[i].tensor = async_writer_->snapshot(i, tensors[i].tensor);
        checkpoint_copy_seconds_ = seconds_since(start) - checkpoint_prepare_seconds_;
        async_writer_->start(checkpoints_root(cfg_), step_, std::move(tensors), extra, keep, &mesh_->world());
        checkpoint_blocking_seconds_ = seconds_since(start);
        return;
    }
    for (CheckpointTensor& c : tensors) c.tensor = to_host(c.tensor);
    checkpoint_copy_seconds_ = seconds_since(start) - checkpoint_prepare_seconds_;
    const std::string dir = checkpoint_write(checkpoints_root(cfg_), step_, tensors, extra, keep, &mesh_->world());
    checkpoint_blocking_seconds_ = seconds_since(start);
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

void Trainer::load_checkpoint_state(const std::string& dir) {
    const auto start = std::chrono::steady_clock::now();
    // verify_on_resume: each rank checks the CRC-32C of the files it reads, as it first reads them.
    std::optional<Checkpoint> opened;
    try {
        opened.emplace(checkpoint_open(dir, cfg_.checkpoint.verify_on_resume ? CrcCheck::on_read : CrcCheck::off));
    } catch (const core::Error& e) {
        if (e.code() != core::ExitCode::checkpoint) throw;
        throw CheckpointCorrupt(e);
    }
    const Checkpoint& ckpt = *opened;
    nn::ParamTable& table = model_->params();
    // What the manifest alone decides comes first: these are not damage, and an older checkpoint would not help.
    checkpoint_check_fits(ckpt.manifest(), model_specs(cfg_.model, table), dir);
    const auto& t = cfg_.train;
    const int64_t step = ckpt.step();
    // The global sample order does not depend on the mesh, so a replicated state resumes on any dp size whose
    // global batch (batch_size x grad_accum x dp) matches.
    load_health_checkpoint(ckpt.manifest());  // the data windows bad steps dropped move the data position
    if (weighting_ && ckpt.manifest().contains("loss_weighting"))
        weighting_->load(ckpt.manifest().at("loss_weighting"));
    const int64_t expected = data::sampler_first_sample(data_step(step), t.grad_accum, 0, data_size(), 0, t.batch_size);
    const auto& data = ckpt.manifest().at("data");
    const int64_t saved = data.value("samples_consumed", expected);
    if (saved != expected)
        core::fail_hint(core::ExitCode::checkpoint,
                        "resume with the checkpoint's global batch (train.batch_size x train.grad_accum x parallel.dp)",
                        "checkpoint consumed {} samples, but step {} with this config's batch implies {} [{}]",
                        saved,
                        step,
                        expected,
                        dir);
    long_check_checkpoint(data, step, dir);
    if (t.steps < step)
        core::fail_hint(core::ExitCode::usage,
                        fmt::format("set train.steps to {} or more to train on from it, or resume from an earlier "
                                    "checkpoint with --resume-from",
                                    step + 1),
                        "train.steps = {} is below step {} of the checkpoint this run resumes [{}]",
                        t.steps,
                        step,
                        dir);
    resume_check_seconds_ = 0.0;
    try {
        read_checkpoint_tensors(ckpt);
    } catch (const core::Error& e) {
        if (e.code() != core::ExitCode::checkpoint) throw;
        throw CheckpointCorrupt(e);
    }
    step_ = step;
    batches_step_ = -1;  // batches read ahead belong to the state before the load
    if (ckpt.manifest().contains("loss_scaler")) scaler_.load_state(ckpt.manifest().at("loss_scaler"));
    last_saved_step_ = step_;
    last_saved_dir_ = dir;
    resumed_from_ = dir;
    resumed_config_ = ckpt.manifest().value("config_toml", "");
    // The part of a restart's downtime the checkpoint costs (its CRC pass and the reads into the state), for the
    // `resumed` event: the rest is the process's start and setup before it, and the first step after.
    resume_load_seconds_ = seconds_since(start);
    resume_crc_seconds_ = ckpt.crc_seconds();
}

void Trainer::read_checkpoint_tensors(const Checkpoint& ckpt) {
    if (async_writer_) async_writer_->before_state_update();  // its callers have joined any write already
    nn::ParamTable& table = model_->params();
    grad_sync_->settle_params();  // no parameter gather of the last step may land after the loaded values
    // Each rank reads the parts it holds out of the global tensors, whatever mesh wrote them.
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (nn::param_tp_split(spec)) {
            table.master(i).copy_from(read_tp_shard(ckpt, "param", spec, table.master(i).dtype()));
        } else if (!nn::param_expert_sharded(spec)) {
            read_to_device(ckpt, "param", spec.name, table.master(i));
        } else {
            read_flat_part(ckpt,
                           "param",
                           spec.name,
                           nn::param_global_shape(spec),
                           nn::param_shard_flat_offset(spec),
                           flat(table.master(i)));
        }
        check_finite(table.master(i), spec.name, "param", ckpt.dir(), resume_check_seconds_);
    }
    for (const optim::AdamW::Piece& p : adamw_->pieces()) {
        const nn::ParamSpec& spec = table.spec(p.param);
        const bool whole = !nn::param_expert_sharded(spec) && p.begin == 0 && p.end == core::shape_numel(spec.shape);
        for (const auto& [kind, state] : moments(*adamw_, p)) {
            if (nn::param_tp_split(spec))
                state.copy_from(read_tp_shard(ckpt, kind, spec, state.dtype())
                                    .reshape({core::shape_numel(spec.shape)})
                                    .slice(0, p.begin, p.end));
            else if (whole)
                read_to_device(ckpt, kind, spec.name, state.reshape(spec.shape));
            else
                read_flat_part(ckpt,
                               kind,
                               spec.name,
                               nn::param_global_shape(spec),
                               nn::param_shard_flat_offset(spec) + p.begin,
                               state);
            check_finite(state, spec.name, kind, ckpt.dir(), resume_check_seconds_);
        }
    }
    // Each rank reads the momentum of the matrices it holds, whatever mesh (and ownership) wrote them.
    if (muon_)
        for (const optim::Muon::Entry& e : muon_->entries()) {
            const nn::ParamSpec& spec = table.spec(e.param);
            if (nn::param_tp_split(spec)) {
                e.momentum.copy_from(
                    read_tp_shard(ckpt, "muon.momentum", spec, e.momentum.dtype()).reshape(e.momentum.shape()));
                check_finite(e.momentum, spec.name, "muon.momentum", ckpt.dir(), resume_check_seconds_);
                continue;
            }
            optim::for_each_matrix_run(e, false, [&](int64_t first, int64_t count, int64_t at) {
                const core::Tensor m = e.momentum.slice(0, at, at + count);
                read_flat_part(ckpt,
                               "muon.momentum",
                               spec.name,
                               nn::param_global_shape(spec),
                               nn::param_shard_flat_offset(spec) + first * m.numel() / count,
                               flat(m));
            });
            check_finite(e.momentum, spec.name, "muon.momentum", ckpt.dir(), resume_check_seconds_);
        }
    load_compress_state(ckpt);
    table.refresh_params_from_master();
    grad_sync_->master_loaded();
    load_moe_checkpoint(ckpt);
}

std::string Trainer::compress_state_name(const parallel::CompressedReduce::State& st) const {
    return fmt::format("rank{:05d}.{}", mesh_->world().rank(), st.name);  // kind "ef": per rank, never resharded
}

void Trainer::load_compress_state(const Checkpoint& ckpt) {
    std::vector<parallel::CompressedReduce::State> states = grad_sync_->compress_states();
    if (states.empty()) return;
    // Only onto the mesh that wrote it, every buffer present: otherwise all restart from zero (conventions §5.2).
    bool same = ckpt.manifest().value("mesh", nlohmann::json()) == mesh_->to_json();
    std::vector<std::string> names;
    for (const auto& st : states) {
        names.push_back(compress_state_name(st));
        same = same && ckpt.has("ef", names.back()) &&
               ckpt.global_shape("ef", names.back()) == core::Shape{static_cast<int64_t>(st.values.size())};
    }
    if (!same) {
        grad_sync_->reset_compress_states();
        if (log_)
            fmt::print(
                "moetrain: warning: the checkpoint's gradient-compression error buffers were written by "
                "another mesh or compression layout: they restart from zero [{}]\n",
                ckpt.dir());
        return;
    }
    for (size_t k = 0; k < states.size(); ++k)
        ckpt.read_into("ef",
                       names[k],
                       core::Tensor::borrow(
                           states[k].values.data(), {static_cast<int64_t>(states[k].values.size())}, core::DType::f32));
}

void Trainer::report_resume() {
    if (!log_) return;
    const std::vector<ConfigDrift> drift = config_drift(resumed_config_, cfg_.to_toml());
    if (!drift.empty()) {
        std::string keys;
        for (const auto& d : drift) keys += fmt::format("\n  {}: {} in the checkpoint, {} now", d.key, d.saved, d.now);
        fmt::print(
            "moetrain: warning: the job config differs from the checkpoint's in {} key(s), so this is no longer an "
            "exact resume (the run will not match one that never stopped):{}\n",
            drift.size(),
            keys);
    }
    fmt::print("moetrain: resumed from {} at step {} (read in {:.1f} s)\n", resumed_from_, step_, resume_load_seconds_);
}

void Trainer::load_checkpoint(const std::string& dir) {
    load_checkpoint_state(dir);
    report_resume();
}

bool Trainer::resume_latest() {
    const std::string root = checkpoints_root(cfg_);
    const std::vector<CheckpointEntry> all = checkpoint_list(root);
    parallel::Comm& world = mesh_->world();
    std::string newest_damage, newest_hint;  // reported when no checkpoint is intact
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
        std::string damage;
        try {
            load_checkpoint_state(it->dir);
        } catch (const CheckpointCorrupt& e) {
            damage = e.what();
            if (it == all.rbegin()) newest_hint = e.hint();
        }
        // Every rank takes the same checkpoint: one damaged on any rank is skipped by all.
        if (world.size() > 1) {
            const auto reasons = parallel::comm_gather_strings(world, damage);
            for (size_t r = 0; r < reasons.size() && damage.empty(); ++r)
                if (!reasons[r].empty()) damage = fmt::format("{} (on rank {})", reasons[r], r);
            if (parallel::comm_all_reduce_max(world, damage.empty() ? int64_t{0} : int64_t{1}) != 0 && damage.empty())
                damage = "damaged on another rank";
        }
        if (damage.empty()) {
            report_resume();
            return true;
        }
        if (it == all.rbegin()) newest_damage = damage;
        if (log_)
            fmt::print("moetrain: warning: skipping the damaged checkpoint {}: {}; {}\n",
                       it->dir,
                       damage,
                       std::next(it) == all.rend()
                           ? "no older one is left"
                           : "falling back to the previous complete one, " + std::next(it)->dir);
    }
    if (!all.empty())
        throw core::Error(core::ExitCode::checkpoint,
                          newest_damage,
                          fmt::format("{}{}no complete checkpoint under {} is intact ({} tried); restore one from a "
                                      "backup, or start over in a new run.dir",
                                      newest_hint,
                                      newest_hint.empty() ? "" : "; ",
                                      root,
                                      all.size()));
    return false;
}

}  // namespace mt::train
