// Trainer state <-> checkpoint: parameters, AdamW moments, step, data position and RNG seed; exact resume.
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "parallel/comm.h"
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

std::vector<TensorSpec> model_specs(const nn::ParamTable& table) {
    std::vector<TensorSpec> specs;
    for (int i = 0; i < table.size(); ++i)
        specs.push_back({table.spec(i).name, nn::param_global_shape(table.spec(i)), table.precision().master});
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

core::Tensor flat(const core::Tensor& t) {
    return t.reshape({t.numel()});
}

// A loaded weight or moment must be finite: a flipped exponent bit that the CRC did not catch (verification off)
// would otherwise resume into a run that diverges a few steps later.
void check_finite(const core::Tensor& t, const std::string& name, const std::string& kind, const std::string& dir) {
    if (t.dtype() != core::DType::f32) return;
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

// A piece's two AdamW moments with their checkpoint kinds.
std::array<std::pair<const char*, core::Tensor>, 2> moments(const optim::AdamW& adamw, const optim::AdamW::Piece& p) {
    return {{{"adamw.m", adamw.m(p)}, {"adamw.v", adamw.v(p)}}};
}

}  // namespace

void Trainer::save_checkpoint() {
    const auto start = std::chrono::steady_clock::now();
    // Every rank writes what it alone holds and each replicated tensor is written once (conventions §5.2): dense
    // parameters by the first rank of dp_span, this rank's experts by the first rank of its edp group (as a box of
    // the global tensor), the AdamW moments with their parameters, or under ZeRO-1 by their owners (flat ranges),
    // and the MoE balancer state (the same on every rank) by world rank 0.
    nn::ParamTable& table = model_->params();
    grad_sync_->gather_master();  // ZeRO-1 keeps the master weights sharded between checkpoints (and gathers
                                  // the forward's weights in the background)
    // Whether this rank writes a replicated parameter: the first of the ranks holding the same copy.
    const bool first_data = mesh_->group(parallel::MeshGroup::dp_span).rank() == 0;
    const bool first_expert = mesh_->group(parallel::MeshGroup::edp).rank() == 0;
    auto replica_writer = [&](const nn::ParamSpec& spec) {
        return nn::param_expert_sharded(spec) ? first_expert : first_data;
    };
    std::vector<CheckpointTensor> tensors;
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (!replica_writer(spec)) continue;
        const core::Shape global = nn::param_global_shape(spec);
        core::Shape offset(global.size(), 0);
        if (nn::param_expert_sharded(spec)) offset[0] = spec.shard_first;
        tensors.push_back({spec.name, "param", to_host(table.master(i)), global, offset});
    }
    for (const optim::AdamW::Piece& p : adamw_->pieces()) {
        const nn::ParamSpec& spec = table.spec(p.param);
        if (!adamw_->sharded() && !replica_writer(spec)) continue;
        const int64_t at = nn::param_shard_flat_offset(spec) + p.begin;
        for (const auto& [kind, state] : moments(*adamw_, p))
            tensors.push_back({spec.name, kind, to_host(state), nn::param_global_shape(spec), {}, at});
    }
    if (mesh_->world().rank() == 0)
        for (auto& moe : moe_checkpoint_tensors()) tensors.push_back({moe.name, moe.kind, to_host(moe.tensor)});
    const auto& t = cfg_.train;
    const int64_t samples = data::sampler_first_sample(step_, t.grad_accum, 0, data_size(), 0, t.batch_size);
    nlohmann::json ranks = nlohmann::json::array();
    for (int64_t r = 0; r < data_size(); ++r) {
        const int64_t first = data::sampler_first_sample(step_, t.grad_accum, 0, data_size(), r, t.batch_size);
        ranks.push_back(
            {{"dp", r}, {"source", "train"}, {"epoch", train_sampler_->epoch_of(first)}, {"sample", first}});
    }
    nlohmann::json extra = {
        {"config_toml", cfg_.to_toml()},
        {"model_signature", model_signature(model_specs(table))},
        {"tokens_seen", tokens_seen(step_)},
        {"mesh", mesh_->to_json()},
        {"rng", {{"seed", cfg_.run.seed}, {"step", step_}}},
        {"loss_scaler", scaler_.state()},
        {"moe", moe_checkpoint_json()},
        {"data", {{"samples_consumed", samples}, {"ranks", ranks}}},
    };
    extra["data"].update(long_checkpoint_json());  // the curriculum stage and position, when there is one
    const std::string dir = checkpoint_write(
        checkpoints_root(cfg_),
        step_,
        tensors,
        extra,
        RetentionPolicy{.keep_last = cfg_.checkpoint.keep_last, .keep_every = cfg_.checkpoint.keep_every},
        &mesh_->world());
    last_saved_step_ = step_;
    last_saved_dir_ = dir;
    if (log_) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print("step {:>6}/{} | checkpoint {} ({:.2f} s)\n", step_, t.steps, dir, secs);
    }
}

void Trainer::load_checkpoint_state(const std::string& dir) {
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
    checkpoint_check_fits(ckpt.manifest(), model_specs(table), dir);
    const auto& t = cfg_.train;
    const int64_t step = ckpt.step();
    // The global sample order does not depend on the mesh, so a replicated state resumes on any dp size whose
    // global batch (batch_size x grad_accum x dp) matches.
    const int64_t expected = data::sampler_first_sample(step, t.grad_accum, 0, data_size(), 0, t.batch_size);
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
}

void Trainer::read_checkpoint_tensors(const Checkpoint& ckpt) {
    nn::ParamTable& table = model_->params();
    grad_sync_->settle_params();  // no parameter gather of the last step may land after the loaded values
    // Each rank reads the parts it holds out of the global tensors, whatever mesh wrote them.
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (!nn::param_expert_sharded(spec)) {
            read_to_device(ckpt, "param", spec.name, table.master(i));
        } else {
            read_flat_part(ckpt,
                           "param",
                           spec.name,
                           nn::param_global_shape(spec),
                           nn::param_shard_flat_offset(spec),
                           flat(table.master(i)));
        }
        check_finite(table.master(i), spec.name, "param", ckpt.dir());
    }
    for (const optim::AdamW::Piece& p : adamw_->pieces()) {
        const nn::ParamSpec& spec = table.spec(p.param);
        const bool whole = !nn::param_expert_sharded(spec) && p.begin == 0 && p.end == core::shape_numel(spec.shape);
        for (const auto& [kind, state] : moments(*adamw_, p)) {
            if (whole)
                read_to_device(ckpt, kind, spec.name, state.reshape(spec.shape));
            else
                read_flat_part(ckpt,
                               kind,
                               spec.name,
                               nn::param_global_shape(spec),
                               nn::param_shard_flat_offset(spec) + p.begin,
                               state);
            check_finite(state, spec.name, kind, ckpt.dir());
        }
    }
    table.refresh_params_from_master();
    grad_sync_->master_loaded();
    load_moe_checkpoint(ckpt);
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
    fmt::print("moetrain: resumed from {} at step {}\n", resumed_from_, step_);
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
