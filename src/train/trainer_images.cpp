// The trainer's image-text data (data.format = "shapes"; docs/multimodal.md): the generated train and val streams,
// and the evaluation over the val split with its exact image-blind bound, greedy exact match and the controls of
// multimodal.md §6 (under pipeline parallelism through the stages: the first encodes the images, the last scores).
#include <fmt/format.h>

#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::images_setup() {
    const data::ShapesOptions options = shapes_options_of(cfg_);
    const int64_t seq = cfg_.train.seq_len, patch = cfg_.model.vision.patch;
    // The text-only twin trains and evaluates on the same captions without their images (control 1).
    const data::ShapesView view{cfg_.data.shapes.text_only ? data::ShapesViewKind::text_only
                                                           : data::ShapesViewKind::plain};
    image_train_ = std::make_unique<ImageTextSource>(options, data::ShapesSplit::train, seq, patch, view);
    image_val_ = std::make_unique<ImageTextSource>(options, data::ShapesSplit::val, seq, patch, view);
    const std::vector<ShapesControl> controls = shapes_controls_run(cfg_);
    if (log_ && controls.size() < cfg_.data.shapes.controls.size())
        fmt::print("shapes: the comp_val control is skipped: stage {} draws none of data.shapes.held_out\n",
                   cfg_.data.shapes.stage);
    for (const ShapesControl c : controls) {
        const data::ShapesSplit split =
            c == ShapesControl::comp_val ? data::ShapesSplit::comp_val : data::ShapesSplit::val;
        image_controls_.emplace_back(
            c, std::make_unique<ImageTextSource>(options, split, seq, patch, shapes_control_view(c)));
    }
}

ShapesEval Trainer::evaluate_shapes_view(ImageTextSource& source) {
    const auto& t = cfg_.train;
    // As evaluate(): the data-parallel ranks share the batches round-robin, and under expert parallelism a rank
    // without a batch in the last round repeats batch 0 and does not count it. A split's rows are the same at every
    // evaluation, so the blind bound is exact for them: the mean over batches of (the blind nats of their supervised
    // caption tokens / their count), as the loss is the mean over batches of per-token means.
    double sum = 0.0, bound = 0.0;
    data::ShapesScore score;
    const int64_t p = data_size(), rounds = (t.eval_batches + p - 1) / p;
    const bool head = model_->chunk_has_head(model_->num_chunks() - 1);
    model_->set_track_predictions(true);
    for (int64_t round = 0; round < rounds; ++round) {
        const int64_t b = round * p + data_rank();
        if (b >= t.eval_batches && mesh_->size(parallel::MeshAxis::ep) == 1) break;
        ImageTextStats stats;
        source.fill(
            (b < t.eval_batches ? b : 0) * t.batch_size, t.batch_size, inputs_, targets_, &eval_images_, &stats);
        const double loss = eval_forward(eval_images_);
        if (b >= t.eval_batches) continue;
        sum += loss;
        bound += stats.supervised > 0 ? stats.blind_nats / static_cast<double>(stats.supervised) : 0.0;
        if (!head) continue;  // the predictions are the last pipeline stage's
        const core::Tensor& pred = model_->last_predictions();
        const core::Tensor host = pred.device() == core::Device::cpu ? pred : pred.to_device(core::Device::cpu);
        const int32_t* tp = targets_.data<int32_t>();
        data::shapes_score_samples({tp, static_cast<size_t>(targets_.numel())},
                                   {host.data<int32_t>(), static_cast<size_t>(host.numel())},
                                   t.seq_len,
                                   source.last_samples(),
                                   &score);
    }
    model_->set_track_predictions(false);
    const auto batches = static_cast<double>(t.eval_batches);
    ShapesEval out{.loss = dp_sum(sum) / batches, .bound = dp_sum(bound) / batches, .score = {}};
    // The counts are integers below 2^53, exact through the f64 sums: over the data ranks, and under pipeline
    // parallelism over the stages (only the last one scored).
    auto total = [&](int64_t v) {
        const double data = dp_sum(static_cast<double>(v));
        return static_cast<int64_t>(
            pipelined() ? parallel::comm_all_reduce_sum(mesh_->group(parallel::MeshGroup::pp), data) : data);
    };
    out.score.samples = total(score.samples);
    out.score.exact = total(score.exact);
    for (int a = 0; a < data::kShapesAttributes; ++a) {
        out.score.attribute_tokens[a] = total(score.attribute_tokens[a]);
        out.score.attribute_correct[a] = total(score.attribute_correct[a]);
    }
    return out;
}

double Trainer::eval_forward(const nn::VisionBatch& images) {
    if (model_->vision() != nullptr) model_->set_vision_batch(images);  // the first pipeline stage's tower, or the one
    return pipelined() ? pipeline_evaluate(inputs_, targets_) : model_->forward(inputs_, targets_, /*training=*/false);
}

double Trainer::evaluate_images() {
    last_shapes_eval_ = evaluate_shapes_view(*image_val_);
    last_eval_bound_ = last_shapes_eval_.bound;
    last_control_evals_.clear();
    for (auto& [control, source] : image_controls_) last_control_evals_.push_back(evaluate_shapes_view(*source));
    return last_shapes_eval_.loss;
}

std::vector<std::pair<ShapesControl, ShapesEval>> Trainer::last_shapes_controls() const {
    std::vector<std::pair<ShapesControl, ShapesEval>> out;
    for (size_t i = 0; i < image_controls_.size() && i < last_control_evals_.size(); ++i)
        out.emplace_back(image_controls_[i].first, last_control_evals_[i]);
    return out;
}

nlohmann::json Trainer::image_eval_fields(double val) const {
    auto ratio = [](double loss, double bound) { return bound > 0 ? loss / bound : 0.0; };
    nlohmann::json f = {{"val_loss", val},
                        {"eval/blind_bound", last_eval_bound_},
                        {"eval/bound_ratio", ratio(val, last_eval_bound_)},
                        {"eval/exact_match", last_shapes_eval_.score.exact_match()}};
    for (size_t i = 0; i < image_controls_.size() && i < last_control_evals_.size(); ++i) {
        const std::string name = nn::enum_name(image_controls_[i].first);
        const ShapesEval& e = last_control_evals_[i];
        f["eval/" + name + "/loss"] = e.loss;
        f["eval/" + name + "/exact_match"] = e.score.exact_match();
        if (image_controls_[i].first == ShapesControl::comp_val) {
            // No finite blind bound under the training prior: accuracy only (multimodal.md §6).
            for (int a = 0; a < data::kShapesAttributes; ++a)
                f["eval/comp_val/acc_" + std::string(data::kShapesAttributeNames[a])] =
                    e.score.accuracy(static_cast<data::ShapesAttribute>(a));
        } else {
            f["eval/" + name + "/bound_ratio"] = ratio(e.loss, e.bound);
        }
    }
    return f;
}

}  // namespace mt::train
