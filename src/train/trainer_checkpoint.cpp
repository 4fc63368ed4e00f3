// Trainer state <-> checkpoint: parameters, AdamW moments, step, data position and RNG seed; exact resume.
#include <array>
#include <chrono>
#include <filesystem>

#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

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
    const nlohmann::json extra = {
        {"config_toml", cfg_.to_toml()},
        {"model_signature", model_signature(model_specs(table))},
        {"tokens_seen", step_ * tokens_per_step()},
        {"mesh", mesh_->to_json()},
        {"rng", {{"seed", cfg_.run.seed}, {"step", step_}}},
        {"loss_scaler", scaler_.state()},
        {"moe", moe_checkpoint_json()},
        {"data", {{"samples_consumed", samples}, {"ranks", ranks}}},
    };
    const std::string dir = checkpoint_write(
        checkpoints_root(cfg_),
        step_,
        tensors,
        extra,
        RetentionPolicy{.keep_last = cfg_.checkpoint.keep_last, .keep_every = cfg_.checkpoint.keep_every},
        &mesh_->world());
    if (log_) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print("step {:>6}/{} | checkpoint {} ({:.2f} s)\n", step_, t.steps, dir, secs);
    }
}

void Trainer::load_checkpoint(const std::string& dir) {
    const Checkpoint ckpt = checkpoint_open(dir, cfg_.checkpoint.verify_on_resume);
    nn::ParamTable& table = model_->params();
    checkpoint_check_fits(ckpt.manifest(), model_specs(table), dir);
    grad_sync_->settle_params();  // no parameter gather of the last step may land after the loaded values
    // Each rank reads the parts it holds out of the global tensors, whatever mesh wrote them.
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (!nn::param_expert_sharded(spec)) {
            read_to_device(ckpt, "param", spec.name, table.master(i));
            continue;
        }
        read_flat_part(ckpt,
                       "param",
                       spec.name,
                       nn::param_global_shape(spec),
                       nn::param_shard_flat_offset(spec),
                       flat(table.master(i)));
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
        }
    }
    table.refresh_params_from_master();
    grad_sync_->master_loaded();
    load_moe_checkpoint(ckpt);
    step_ = ckpt.step();
    if (ckpt.manifest().contains("loss_scaler")) scaler_.load_state(ckpt.manifest().at("loss_scaler"));
    const auto& t = cfg_.train;
    const auto& data = ckpt.manifest().at("data");
    // The global sample order does not depend on the mesh, so a replicated state resumes on any dp size whose
    // global batch (batch_size x grad_accum x dp) matches.
    const int64_t expected = data::sampler_first_sample(step_, t.grad_accum, 0, data_size(), 0, t.batch_size);
    const int64_t saved = data.value("samples_consumed", expected);
    if (saved != expected)
        core::fail_hint(core::ExitCode::checkpoint,
                        "resume with the checkpoint's global batch (train.batch_size x train.grad_accum x parallel.dp)",
                        "checkpoint consumed {} samples, but step {} with this config's batch implies {} [{}]",
                        saved,
                        step_,
                        expected,
                        dir);
    if (log_) fmt::print("moetrain: resumed from {} at step {}\n", dir, step_);
}

bool Trainer::resume_latest() {
    const auto latest = checkpoint_find_latest(checkpoints_root(cfg_));
    if (!latest) return false;
    load_checkpoint(*latest);
    return true;
}

}  // namespace mt::train
