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
    nn::ParamTable& table = model_->params();
    std::vector<CheckpointTensor> tensors;
    for (int i = 0; i < table.size(); ++i) {
        const std::string& name = table.spec(i).name;
        tensors.push_back({name, "param", to_host(table.master(i))});
        tensors.push_back({name, "adamw.m", to_host(adamw_->m(i))});
        tensors.push_back({name, "adamw.v", to_host(adamw_->v(i))});
    }
    for (auto& moe : moe_checkpoint_tensors()) tensors.push_back(std::move(moe));
    const auto& t = cfg_.train;
    const int64_t samples = data::sampler_first_sample(step_, t.grad_accum, 0, 1, 0, t.batch_size);
    const nlohmann::json extra = {
        {"config_toml", cfg_.to_toml()},
        {"model_signature", model_signature(model_specs(table))},
        {"tokens_seen", step_ * tokens_per_step()},
        {"mesh", {{"order", "tp-cp-ep-dp-pp"}, {"tp", 1}, {"cp", 1}, {"ep", 1}, {"dp", 1}, {"pp", 1}, {"world", 1}}},
        {"rng", {{"seed", cfg_.run.seed}, {"step", step_}}},
        {"loss_scaler", scaler_.state()},
        {"moe", moe_checkpoint_json()},
        {"data",
         {{"samples_consumed", samples},
          {"ranks",
           {{{"dp", 0}, {"source", "train"}, {"epoch", train_sampler_->epoch_of(samples)}, {"sample", samples}}}}}},
    };
    const std::string dir = checkpoint_write(
        checkpoints_root(cfg_),
        step_,
        tensors,
        extra,
        RetentionPolicy{.keep_last = cfg_.checkpoint.keep_last, .keep_every = cfg_.checkpoint.keep_every});
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
    const int64_t expected = data::sampler_first_sample(step_, t.grad_accum, 0, 1, 0, t.batch_size);
    const int64_t saved = data.value("samples_consumed", expected);
    if (saved != expected)
        core::fail_hint(core::ExitCode::checkpoint,
                        "resume with the checkpoint's train.batch_size and train.grad_accum",
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
