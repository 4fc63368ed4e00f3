// What keeps a run's work when the outside world interferes: each step's batches are read before its collectives,
// so that a token file that changed (or a SIGBUS on its map, core/signals.h) and a SIGTERM/SIGINT on any rank are
// agreed by every rank at a step boundary, where the state is whole and a checkpoint can be written together.
#include <filesystem>

#include "core/signals.h"
#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// step_status's agreed value above every signal number: a rank's token data failed.
constexpr int64_t kDataFailed = 1000;

}  // namespace

void Trainer::allocate_step_batches() {
    const auto& t = cfg_.train;
    const core::Shape shape = {t.grad_accum, t.batch_size, seq_len_};  // a curriculum stage changes seq_len_
    if (step_inputs_.defined() && step_inputs_.shape() == shape) return;
    step_inputs_ = core::Tensor::zeros(shape, core::DType::i32);
    step_targets_ = core::Tensor::zeros(shape, core::DType::i32);
}

void Trainer::read_step_batches() {
    const auto& t = cfg_.train;
    long_prepare_step();
    allocate_step_batches();
    batches_step_ = -1;  // until every micro-batch is in
    if (image_batches()) step_images_.resize(static_cast<size_t>(t.grad_accum));
    for (int64_t micro = 0; micro < t.grad_accum; ++micro)
        fill_batch(step_,
                   micro,
                   step_inputs_.select(0, micro),
                   step_targets_.select(0, micro),
                   image_batches() ? &step_images_[static_cast<size_t>(micro)] : nullptr);
    batches_step_ = step_;
}

int64_t Trainer::step_status() {
    int64_t local = 0;
    data_error_.reset();
    try {
        read_step_batches();
        // After the reads: a file rewritten while they ran has a new modification time or size by now.
        if (train_source_) train_source_->check_unchanged();
        if (val_source_) val_source_->check_unchanged();
    } catch (const core::Error& e) {
        if (e.code() != core::ExitCode::data) throw;
        data_error_ = e;
        // A read that failed on a file that changed (a token out of range in rewritten bytes) is the change.
        try {
            if (train_source_) train_source_->check_unchanged();
            if (val_source_) val_source_->check_unchanged();
        } catch (const core::Error& changed) {
            data_error_ = changed;
        }
        batches_step_ = -1;
        local = kDataFailed;
    }
    if (local == 0) local = core::signals_stop_requested();
    parallel::Comm& world = mesh_->world();
    return world.size() > 1 ? parallel::comm_all_reduce_max(world, local) : local;
}

void Trainer::save_checkpoint_if_new() {
    finish_checkpoint_write();  // the one in flight may be of this step
    if (step_ > 0 && step_ != last_saved_step_) save_checkpoint();
}

RunEnd Trainer::stop_run(int64_t status) {
    const auto& t = cfg_.train;
    save_checkpoint_if_new();
    const std::string saved =
        last_saved_step_ == step_ && step_ > 0
            ? fmt::format("checkpoint {}", last_saved_dir_.empty() ? std::string("loaded at start") : last_saved_dir_)
            : "no checkpoint (no step done yet)";
    std::fflush(stdout);
    if (status == kDataFailed) {
        // Every rank ends with the first failing rank's message, so that rank 0 can print it once (cli/main.cpp).
        std::string what = data_error_ ? data_error_->what() : "", hint = data_error_ ? data_error_->hint() : "";
        parallel::Comm& world = mesh_->world();
        if (world.size() > 1) {
            const auto all = parallel::comm_gather_strings(world, what + '\n' + hint);
            for (size_t r = 0; r < all.size() && what.empty(); ++r) {
                const size_t nl = all[r].find('\n');
                if (nl == 0) continue;
                what = r == 0 ? all[r].substr(0, nl) : fmt::format("{} (on rank {})", all[r].substr(0, nl), r);
                hint = all[r].substr(nl + 1);
            }
            if (what.empty()) what = "the token data failed on another rank";
        }
        metrics_->write(step_, "event", {{"event", "data_failed"}, {"detail", what}});
        hint += fmt::format("{}the run stopped after step {} with {}", hint.empty() ? "" : "; ", step_, saved);
        throw core::Error(core::ExitCode::data, what, hint);
    }
    const std::string signal = core::signal_name(static_cast<int>(status));
    metrics_->write(step_, "event", {{"event", "stopped"}, {"signal", signal}});
    if (log_)
        fmt::print("moetrain: stopped by {} after step {} of {}: {} (continue with --resume; exit code {})\n",
                   signal,
                   step_,
                   t.steps,
                   saved,
                   static_cast<int>(core::ExitCode::stopped));
    std::fflush(stdout);
    return RunEnd::stopped;
}

void Trainer::check_validation_data() const {
    // The batches every evaluation reads are the same, so a token outside the vocabulary among them would stop the
    // run at its first evaluation: read them all once now, this rank's share, as evaluate() does.
    const auto& t = cfg_.train;
    // Generated samples, and image-text ids made from the tokenizer the config checked, cannot be out of the
    // vocabulary.
    if (t.eval_every <= 0 || image_val_ || disk_train_ || mix_) return;
    const data::Sampler& sampler = val_sampler_ ? *val_sampler_ : *train_sampler_;
    const core::Tensor inputs = core::Tensor::zeros({t.batch_size, seq_len_}, core::DType::i32);
    const core::Tensor targets = core::Tensor::zeros({t.batch_size, seq_len_}, core::DType::i32);
    for (int64_t b = data_rank(); b < t.eval_batches; b += data_size())
        sampler.fill_sequential(b * t.batch_size, t.batch_size, inputs, targets);
}

std::string Trainer::nonfinite_hint() const {
    // The newest checkpoint at or before this step holds the weights that led here and replays the same data, so
    // resuming from it repeats the failure unless something changes: point at the one before it.
    std::vector<CheckpointEntry> older;
    for (const auto& c : checkpoint_list(cfg_.run.dir + "/checkpoints"))
        if (c.step <= step_) older.push_back(c);
    if (older.size() >= 2)
        return fmt::format(
            "lower train.lr (or train.grad_clip) and resume with --resume-from {}; the newest checkpoint, {}, leads "
            "to this step again",
            older[older.size() - 2].dir,
            older.back().dir);
    if (older.size() == 1)
        return fmt::format(
            "lower train.lr (or train.grad_clip) and start again; the only checkpoint, {}, leads to this step again",
            older.back().dir);
    return "lower train.lr (or train.grad_clip) and start again";
}

}  // namespace mt::train
