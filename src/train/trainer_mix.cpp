// The trainer's mixed sources (data.sources) and multi-task loss weighting (loss.weighting): docs/multimodal.md "Mixed
// sources and loss weighting", multimodal.md §5 and §8. Each row's source is a function of its global row index
// (train/mixed_source.h), so every rank knows the source of every row it reads; the per-source sums go over the
// data-parallel ranks with one all-reduce each.
#include <fmt/format.h>

#include "parallel/comm.h"
#include "train/loss_gradnorm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::mix_setup() {
    mix_ = std::make_unique<MixedSource>(cfg_, log_);
    const auto& t = cfg_.train;
    weighting_ = std::make_unique<LossWeighting>(cfg_.loss, mix_->size(), t.beta1, t.beta2, t.eps);
    if (log_) fmt::print("moetrain: mixed sources: {}; loss weighting {}\n", mix_->describe(), cfg_.loss.weighting);
}

void Trainer::mix_step_begin(double n_global, double loss_scale) {
    const auto& t = cfg_.train;
    const auto k = static_cast<size_t>(mix_->size());
    mix_row_sources_.assign(static_cast<size_t>(t.grad_accum), {});
    std::vector<double> local(k, 0.0);
    for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
        // The rows fill_batch read for this micro-batch: their sources follow from their global indices.
        const int64_t first =
            data::sampler_first_sample(data_step(step_), t.grad_accum, micro, data_size(), data_rank(), t.batch_size);
        const core::Tensor targets = step_targets_.select(0, micro);
        const int32_t* tp = targets.data<int32_t>();
        std::vector<int32_t>& rows = mix_row_sources_[static_cast<size_t>(micro)];
        for (int64_t b = 0; b < t.batch_size; ++b) {
            rows.push_back(mix_->source_of_row(first + b));
            for (int64_t j = 0; j < targets.size(1); ++j)
                local[static_cast<size_t>(rows.back())] += tp[b * targets.size(1) + j] != nn::kIgnoreIndex;
        }
    }
    mix_tokens_.clear();
    double total = 0.0;
    for (const double x : local) {
        mix_tokens_.push_back(dp_sum(x));
        total += mix_tokens_.back();
    }
    MT_CHECK(total == n_global, "the sources' {} supervised tokens are not the batch's {}", total, n_global);
    mix_loss_sum_.assign(k, 0.0);
    if (cfg_.loss.weighting != "gradnorm" || n_global <= 0) return;
    if (gradnorm_param_ < 0)
        gradnorm_param_ = gradnorm_param(model_->params(), cfg_.model.n_layers, cfg_.loss.gradnorm_layer);
    auto micro = [&](int64_t m) {
        if (model_->vision())
            model_->set_vision_batch(m < std::ssize(step_images_) ? step_images_[static_cast<size_t>(m)]
                                                                  : nn::VisionBatch{});
        return std::make_pair(step_inputs_.select(0, m), step_targets_.select(0, m));
    };
    auto reduce = [&](core::Tensor& g) {
        if (data_size() > 1) mesh_->group(parallel::MeshGroup::dp_span).all_reduce(g).wait();
    };
    weighting_->set_grad_norms(gradnorm_grad_norms(*model_,
                                                   gradnorm_param_,
                                                   t.grad_accum,
                                                   micro,
                                                   mix_row_sources_,
                                                   weighting_->weights(),
                                                   n_global,
                                                   loss_scale,
                                                   reduce));
    // The measuring forwards are not the step's: their routing counts, maxima and layer sums start over.
    model_->moe_step_discard();
    model_->reset_max_logits();
    layer_stats_begin();
}

double Trainer::mix_micro_forward(int64_t micro) {
    const std::vector<int32_t>& rows = mix_row_sources_.at(static_cast<size_t>(micro));
    if (!weighting_->plain()) {
        // Each row weighs its source's multiplier against the token mean (train/loss_weighting.h).
        const std::vector<double> m = weighting_->multipliers(mix_tokens_);
        std::vector<double> w;
        for (const int32_t k : rows) w.push_back(m[static_cast<size_t>(k)]);
        model_->set_row_loss_weights(std::move(w));
    }
    const core::Tensor targets = step_targets_.select(0, micro);
    const double loss = model_->forward(step_inputs_.select(0, micro), targets);
    // C_i: the rows' summed token losses (0 at ignored targets), before the backward overwrites them.
    const core::Tensor& losses = model_->last_token_losses();
    const core::Tensor host = losses.device() == core::Device::cpu ? losses : losses.to_device(core::Device::cpu);
    const int64_t seq = targets.size(1);
    for (size_t b = 0; b < rows.size(); ++b) {
        double row = 0.0;
        for (int64_t j = 0; j < seq; ++j) row += core::tensor_get_flat(host, static_cast<int64_t>(b) * seq + j);
        mix_loss_sum_[static_cast<size_t>(rows[b])] += row;
    }
    return loss;
}

void Trainer::mix_step_end(StepResult& r) {
    r.source_loss_sum.clear();
    for (const double c : mix_loss_sum_) r.source_loss_sum.push_back(dp_sum(c));
    r.source_tokens = mix_tokens_;
    r.source_weight = weighting_->weights();
    model_->set_row_loss_weights({});  // the weights were the step's: an eval forward is the plain mean
    // The model's weighted mean is sum_i m_i C_i / N; uncertainty's objective adds sum_i s_i / 2 (multimodal.md §5).
    if (cfg_.loss.weighting == "uncertainty")
        for (const double s : weighting_->log_variances()) r.loss += 0.5 * s;
}

void Trainer::mix_step_applied(const StepResult& r) {
    if (mix_ && !r.skipped) weighting_->update(r.source_loss_sum, r.source_tokens, r.lr);
}

double Trainer::evaluate_mix() {
    const auto& t = cfg_.train;
    // Each source's val rows on their own, as evaluate() shares batches over the data-parallel ranks (under expert
    // parallelism a rank without a batch in the last round repeats batch 0 and does not count it). val_loss is the
    // mean over the sources weighted by their shares of the mixture.
    mix_eval_losses_.clear();
    double val = 0.0;
    const std::vector<double> shares = mix_->shares();
    const int64_t p = data_size(), rounds = (t.eval_batches + p - 1) / p;
    for (int32_t k = 0; k < mix_->size(); ++k) {
        double sum = 0.0;
        for (int64_t round = 0; round < rounds; ++round) {
            const int64_t b = round * p + data_rank();
            if (b >= t.eval_batches && mesh_->size(parallel::MeshAxis::ep) == 1) break;
            mix_->fill_val(
                k, (b < t.eval_batches ? b : 0) * t.batch_size, t.batch_size, inputs_, targets_, &eval_images_);
            const double loss = eval_forward(eval_images_);
            if (b < t.eval_batches) sum += loss;
        }
        mix_eval_losses_.push_back(dp_sum(sum) / static_cast<double>(t.eval_batches));
        val += shares[static_cast<size_t>(k)] * mix_eval_losses_.back();
    }
    return val;
}

void Trainer::add_mix_metrics(const StepResult& r, nlohmann::json& fields) const {
    if (!mix_) return;
    for (size_t i = 0; i < r.source_tokens.size(); ++i) {
        const std::string& name = cfg_.data_sources[i].name;
        // L_i = C_i / N_i, the source's mean token loss; left out of a step without its tokens.
        if (r.source_tokens[i] > 0) fields["loss/" + name] = r.source_loss_sum[i] / r.source_tokens[i];
        fields["loss_weight/" + name] = r.source_weight[i];
    }
}

nlohmann::json Trainer::eval_fields(double val) const {
    if (image_val_) return image_eval_fields(val);
    nlohmann::json f = {{"val_loss", val}};
    if (mix_)
        for (size_t i = 0; i < mix_eval_losses_.size(); ++i)
            f["eval/" + cfg_.data_sources[i].name + "/loss"] = mix_eval_losses_[i];
    return f;
}

}  // namespace mt::train
