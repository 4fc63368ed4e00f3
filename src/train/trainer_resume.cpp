// Trainer state <- checkpoint: resume (the newest intact checkpoint, falling back past damaged ones), the load of
// parameters, AdamW and Muon state, error feedback and the manifest's state, each checked finite; exact resume.
#include <chrono>
#include <cmath>
#include <optional>

#include "core/clock.h"
#include "ops/global_norm.h"
#include "parallel/comm.h"
#include "train/async_checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/config_drift.h"
#include "train/trainer.h"
#include "train/trainer_checkpoint_parts.h"

namespace mt::train {

using namespace checkpoint_parts;

namespace {

// A checkpoint that is damaged (unreadable, truncated, a CRC-32C mismatch, a non-finite value), as opposed to one
// that does not fit this run: resume_latest falls back to an older one for these only.
class CheckpointCorrupt : public core::Error {
   public:
    explicit CheckpointCorrupt(const core::Error& e) : core::Error(e) {}
};

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

// A loaded weight or moment must be finite: a flipped exponent bit that the CRC did not catch (verification off)
// would otherwise resume into a run that diverges a few steps later.
void check_finite(const core::Tensor& t, const std::string& name, const std::string& kind, const std::string& dir) {
    if (t.dtype() != core::DType::f32) return;
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

}  // namespace

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
    resume_load_seconds_ = core::seconds_since(start);
    resume_crc_seconds_ = ckpt.crc_seconds();
}

void Trainer::read_checkpoint_tensors(const Checkpoint& ckpt) {
    if (async_writer_) async_writer_->before_state_update();  // its callers have joined any write already
    nn::ParamTable& table = model_->params();
    grad_sync_->settle_params();  // no parameter gather of the last step may land after the loaded values
    // Each loaded tensor's finiteness check, its time added to the `resumed` event's load_check_seconds.
    auto check_finite_timed = [&](const core::Tensor& t, const std::string& name, const std::string& kind) {
        const auto start = std::chrono::steady_clock::now();
        check_finite(t, name, kind, ckpt.dir());
        resume_check_seconds_ += core::seconds_since(start);
    };
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
        check_finite_timed(table.master(i), spec.name, "param");
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
            check_finite_timed(state, spec.name, kind);
        }
    }
    // Each rank reads the momentum of the matrices it holds, whatever mesh (and ownership) wrote them.
    if (muon_)
        for (const optim::Muon::Entry& e : muon_->entries()) {
            const nn::ParamSpec& spec = table.spec(e.param);
            if (nn::param_tp_split(spec)) {
                e.momentum.copy_from(
                    read_tp_shard(ckpt, "muon.momentum", spec, e.momentum.dtype()).reshape(e.momentum.shape()));
                check_finite_timed(e.momentum, spec.name, "muon.momentum");
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
            check_finite_timed(e.momentum, spec.name, "muon.momentum");
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
