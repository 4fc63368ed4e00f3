// Trainer state <-> checkpoint: parameters, AdamW moments, step, data position and RNG seed; exact resume.
#include <filesystem>

#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

std::vector<TensorSpec> model_specs(const nn::ParamTable& table) {
    std::vector<TensorSpec> specs;
    for (int i = 0; i < table.size(); ++i)
        specs.push_back({table.spec(i).name, table.spec(i).shape, table.precision().master});
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

}  // namespace

void Trainer::save_checkpoint() {
    const auto start = std::chrono::steady_clock::now();
    // Without sharded state every data-parallel replica holds the same weights and moments, so world rank 0 writes
    // the whole state (conventions §5.2: replicas write once) and the others wait for it to be complete.
    if (mesh_->world().rank() != 0) {
        mesh_->world().barrier();
        return;
    }
    nn::ParamTable& table = model_->params();
    std::vector<CheckpointTensor> tensors;
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        tensors.push_back({name, "param", to_host(table.master(i))});
        tensors.push_back({name, "adamw.m", to_host(adamw_->m(i))});
        tensors.push_back({name, "adamw.v", to_host(adamw_->v(i))});
    }
    for (auto& moe : moe_checkpoint_tensors()) tensors.push_back({moe.name, moe.kind, to_host(moe.tensor)});
    const auto& t = cfg_.train;
    const int64_t samples = data::sampler_first_sample(step_, t.grad_accum, 0, dp_size(), 0, t.batch_size);
    nlohmann::json ranks = nlohmann::json::array();
    for (int64_t r = 0; r < dp_size(); ++r) {
        const int64_t first = data::sampler_first_sample(step_, t.grad_accum, 0, dp_size(), r, t.batch_size);
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
        RetentionPolicy{.keep_last = cfg_.checkpoint.keep_last, .keep_every = cfg_.checkpoint.keep_every});
    mesh_->world().barrier();
    if (log_) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print("step {:>6}/{} | checkpoint {} ({:.2f} s)\n", step_, t.steps, dir, secs);
    }
}

void Trainer::load_checkpoint(const std::string& dir) {
    const Checkpoint ckpt = checkpoint_open(dir, cfg_.checkpoint.verify_on_resume);
    nn::ParamTable& table = model_->params();
    checkpoint_check_fits(ckpt.manifest(), model_specs(table), dir);
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        read_to_device(ckpt, "param", name, table.master(i));
        read_to_device(ckpt, "adamw.m", name, adamw_->m(i));
        read_to_device(ckpt, "adamw.v", name, adamw_->v(i));
    }
    table.refresh_params_from_master();
    load_moe_checkpoint(ckpt);
    step_ = ckpt.step();
    if (ckpt.manifest().contains("loss_scaler")) scaler_.load_state(ckpt.manifest().at("loss_scaler"));
    const auto& t = cfg_.train;
    const auto& data = ckpt.manifest().at("data");
    // The global sample order does not depend on the mesh, so a replicated state resumes on any dp size whose
    // global batch (batch_size x grad_accum x dp) matches.
    const int64_t expected = data::sampler_first_sample(step_, t.grad_accum, 0, dp_size(), 0, t.batch_size);
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
