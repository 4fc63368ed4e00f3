// The context-length curriculum in the trainer (docs/long_context.md "The context-length curriculum"): stage k covers a
// fixed range of optimizer steps (data::curriculum_first_steps), so the stage and the position in it follow from the
// step alone and a resume continues the stage's sample stream exactly; the manifest records them to catch a changed
// schedule.
#include <cmath>

#include "data/tokenizer.h"
#include "ops/global_norm.h"
#include "train/passkey.h"
#include "train/trainer.h"

namespace mt::train {

namespace {

// The EOT that ends documents in the token files: data.eot_token, else the tokenizer's (what `moetrain data` writes).
int32_t data_eot(const JobConfig& cfg) {
    if (cfg.model.eot_token >= 0) return static_cast<int32_t>(cfg.model.eot_token);
    return data::tokenizer_open(cfg.data.tokenizer)->eot_id();
}

// How a stage's rows are drawn, for the log.
std::string stage_mix(const LongStage& s) {
    return s.long_fraction < 0 ? std::string("the natural mix") : fmt::format("long fraction {}", s.long_fraction);
}

}  // namespace

int64_t Trainer::tokens_seen(int64_t steps) const {
    const auto& stages = cfg_.long_ctx.stages;
    if (stages.empty()) return steps * rows_per_step() * cfg_.train.seq_len;
    int64_t tokens = 0;
    for (size_t s = 0; s < stages.size(); ++s) {
        const int64_t begin = stage_first_step_[s];
        const int64_t end = s + 1 < stages.size() ? std::min(steps, stage_first_step_[s + 1]) : steps;
        if (end > begin) tokens += (end - begin) * rows_per_step() * stages[s].seq_len;
    }
    return tokens;
}

void Trainer::long_setup() {
    const auto& stages = cfg_.long_ctx.stages;
    if (stages.empty()) return;
    std::vector<int64_t> seq_lens, tokens;
    for (const LongStage& s : stages) {
        seq_lens.push_back(s.seq_len);
        tokens.push_back(s.tokens);
    }
    stage_first_step_ = data::curriculum_first_steps(seq_lens, tokens, rows_per_step());
    doc_index_ =
        std::make_unique<data::DocIndex>(data::doc_index_build(*train_source_, cfg_.data.paths, data_eot(cfg_)));
    // Every stage's pools now, so that a stage without long documents (or without replay) fails before step 0.
    int64_t tagged = 0;
    for (const uint8_t t : doc_index_->tagged) tagged += t;
    if (log_)
        fmt::print("moetrain: curriculum of {} stages over {} documents ({} tagged long)\n",
                   stages.size(),
                   doc_index_->size(),
                   tagged);
    for (size_t s = 0; s < stages.size(); ++s) {
        const data::CurriculumSampler check(*train_source_,
                                            *doc_index_,
                                            static_cast<int64_t>(s),
                                            stages[s].seq_len,
                                            stages[s].long_fraction,
                                            static_cast<uint64_t>(cfg_.run.seed));
        if (log_)
            fmt::print("moetrain:   stage {}: seq_len {}, {} tokens from step {}, {} ({} long / {} short documents)\n",
                       s,
                       stages[s].seq_len,
                       stages[s].tokens,
                       stage_first_step_[s],
                       stage_mix(stages[s]),
                       check.num_long_documents(),
                       check.num_short_documents());
        // Validation reads windows of the stage's length: data too short for a later stage fails now, naming its
        // files (exit 3), not at that stage's switch hours into the run.
        if (val_source_) data::Sampler(*val_source_, stages[s].seq_len, static_cast<uint64_t>(cfg_.run.seed));
    }
    long_prepare_step();
}

void Trainer::long_prepare_step() {
    if (stage_first_step_.empty()) return;
    const int64_t s = data::curriculum_stage_of_step(stage_first_step_, step_);
    if (s == stage_) {
        // The same stage (a resume inside the stage the constructor prepared): its start event belongs to its first
        // step only.
        stage_started_ = stage_started_ && step_ == stage_first_step();
        return;
    }
    const LongStage& st = cfg_.long_ctx.stages[static_cast<size_t>(s)];
    const auto& t = cfg_.train;
    const auto seed = static_cast<uint64_t>(cfg_.run.seed);
    stage_ = s;
    seq_len_ = st.seq_len;
    model().set_segments(config_segments_for_length(cfg_, seq_len_));  // long.tokens_per_gpu: the stage's segments
    // The stage's RoPE base (ABF), model.rope_theta where it sets none; from the step, so a resume sets it too.
    model().set_rope_theta(st.rope_base > 0.0 ? st.rope_base : cfg_.model.rope_theta);
    stage_sampler_ =
        std::make_unique<data::CurriculumSampler>(*train_source_, *doc_index_, s, st.seq_len, st.long_fraction, seed);
    // Validation reads windows of the stage's length (of the training stream when there is no validation data).
    train_sampler_ = std::make_unique<data::Sampler>(*train_source_, seq_len_, seed);
    if (val_source_) val_sampler_ = std::make_unique<data::Sampler>(*val_source_, seq_len_, seed);
    inputs_ = core::Tensor::zeros({t.batch_size, seq_len_}, core::DType::i32);
    targets_ = core::Tensor::zeros({t.batch_size, seq_len_}, core::DType::i32);
    batches_step_ = -1;
    stage_started_ = step_ == stage_first_step();
}

void Trainer::long_stage_start() {
    stage_started_ = false;
    const LongStage& st = cfg_.long_ctx.stages[static_cast<size_t>(stage_)];
    nlohmann::json event = {
        {"event", "long_stage"},
        {"stage", stage_},
        {"seq_len", st.seq_len},
        {"tokens", st.tokens},
        {"long_fraction", st.long_fraction < 0 ? nlohmann::json() : nlohmann::json(st.long_fraction)},
        {"tokens_seen", tokens_seen(step_)},
        // The stage's segments (long.tokens_per_gpu may raise them): J after the first batch in long/segments.
        {"segment_tokens", model().config().segments.tokens},
        {"segments", model().config().segments.count}};
    const int64_t segment_tokens = model().config().segments.tokens;
    if (log_)
        fmt::print("step {:>6}/{} | curriculum stage {}: seq_len {}, {}, {} tokens{}\n",
                   step_,
                   cfg_.train.steps,
                   stage_,
                   st.seq_len,
                   stage_mix(st),
                   st.tokens,
                   segment_tokens > 0 ? fmt::format(", segments of {} tokens", segment_tokens) : "");
    if (cfg_.long_ctx.passkey_eval) {
        const auto tokenizer = data::tokenizer_open(cfg_.data.tokenizer);
        if (tokenizer->vocab_size() > cfg_.model.vocab_size) {
            event["passkey"] = "skipped: the tokenizer's vocabulary is larger than the model's";
        } else {
            const PasskeyResult p = passkey_eval(
                model(), *tokenizer, seq_len_, cfg_.train.batch_size, static_cast<uint64_t>(cfg_.run.seed), stage_);
            if (!p.ran) {
                event["passkey"] = "skipped: the stage is too short for the prompt";
            } else {
                event["passkey/loss"] = p.mean_loss;
                event["passkey/p_key"] = p.mean_p_key;
                event["passkey/depth"] = p.depth;
                event["passkey/loss_by_depth"] = p.loss;
                event["passkey/p_key_by_depth"] = p.p_key;
                if (log_)
                    fmt::print("step {:>6}/{} | passkey at {} tokens: key loss {:.4f}, p(key) {:.3g} (10 depths)\n",
                               step_,
                               cfg_.train.steps,
                               seq_len_,
                               p.mean_loss,
                               p.mean_p_key);
            }
        }
    }
    metrics_->write(step_, "event", event);
}

void Trainer::add_long_metrics(nlohmann::json& fields) {
    fields["long/seq_len"] = seq_len_;
    fields["long/segments"] = static_cast<int64_t>(model_->segment_bounds().size()) - 1;  // J of the last batch
    for (const auto& [layer, state] : model_->kda_final_states()) {
        // RMS of the final state over its [B, HV, K, V] values: a state that grows with the length shows here first.
        const double sq = ops::global_norm_sq(state);
        fields[fmt::format("long/kda_state_rms/l{:02d}", layer)] = std::sqrt(sq / static_cast<double>(state.numel()));
    }
    // The largest pre-softmax logit of each softmax attention layer over the last micro-batch (finite once one ran).
    for (const auto& [layer, logit] : model_->attention_max_logits())
        if (std::isfinite(logit)) fields[fmt::format("long/max_logit/l{:02d}", layer)] = logit;
    if (!stage_sampler_) return;
    // The step just done is step_ - 1, still in stage_ (the next stage is prepared when its batches are read). Its rows
    // are global samples [done - rows, done) of the stage on all ranks together; the sampler counts their long tokens
    // from the schedule alone, so no rank sends anything. The stage's sum is kept as it grows (a natural-mix stage
    // looks at every row once).
    const int64_t rows = rows_per_step(), done = (step_ - stage_first_step()) * rows;
    if (long_counted_stage_ != stage_ || long_counted_rows_ > done) {
        long_counted_stage_ = stage_;
        long_counted_rows_ = 0;
        long_counted_tokens_ = 0;
    }
    long_counted_tokens_ += stage_sampler_->long_tokens(long_counted_rows_, done);
    long_counted_rows_ = done;
    const int64_t step_long = stage_sampler_->long_tokens(done - rows, done);
    const double stage_share = static_cast<double>(long_counted_tokens_) / static_cast<double>(done * seq_len_);
    fields["long/stage"] = stage_;
    fields["long/long_share"] = static_cast<double>(step_long) / static_cast<double>(rows * seq_len_);
    fields["long/stage_long_share"] = stage_share;
    fields["long/stage_replay_share"] = stage_sampler_->natural() ? 0.0 : 1.0 - stage_share;
    fields["long/stage_tokens"] = done * seq_len_;
}

nlohmann::json Trainer::long_checkpoint_json() const {
    return long_position(step_);
}

nlohmann::json Trainer::long_position(int64_t step) const {
    if (stage_first_step_.empty()) return nlohmann::json::object();
    // The position of the next step to run: its stage and the tokens that stage has trained on so far.
    const int64_t s = data::curriculum_stage_of_step(stage_first_step_, step);
    const int64_t steps_in = step - stage_first_step_[static_cast<size_t>(s)];
    return {{"stage", s},
            {"stage_step", steps_in},
            {"stage_tokens", steps_in * rows_per_step() * cfg_.long_ctx.stages[static_cast<size_t>(s)].seq_len}};
}

void Trainer::long_check_checkpoint(const nlohmann::json& data, int64_t step, const std::string& dir) const {
    // A checkpoint from before the curriculum (no stage saved) starts it at its step's stage.
    if (stage_first_step_.empty() || !data.contains("stage")) return;
    const nlohmann::json expected = long_position(step);
    for (const char* key : {"stage", "stage_tokens"})
        if (data.value(key, int64_t{-1}) != expected.at(key).get<int64_t>())
            core::fail_hint(
                core::ExitCode::checkpoint,
                "resume with the checkpoint's [[long.stages]] and global batch (its config is in "
                "manifest.json), or start a new run",
                "checkpoint is at curriculum stage {} after {} of its tokens, but step {} with this config's "
                "stages is at stage {} after {} [{}]",
                data.value("stage", int64_t{-1}),
                data.value("stage_tokens", int64_t{-1}),
                step,
                expected.at("stage").get<int64_t>(),
                expected.at("stage_tokens").get<int64_t>(),
                dir);
}

}  // namespace mt::train
