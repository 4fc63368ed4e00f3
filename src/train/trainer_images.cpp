// The trainer's image-text data (data.format = "shapes"; docs/multimodal.md): the generated train and val streams,
// and the evaluation over the val split with its exact image-blind bound (multimodal.md §6).
#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::images_setup() {
    const ShapesDataConfig& s = cfg_.data.shapes;
    data::ShapesOptions options{
        .seed = static_cast<uint64_t>(s.seed >= 0 ? s.seed : cfg_.run.seed),
        .max_objects = static_cast<int>(s.max_objects),
        .held_out = {},
        .val_size = s.val_size,
        .format = s.format,
        .stage = static_cast<int>(s.stage),
    };
    for (const std::string& pair : s.held_out) {
        const size_t space = pair.find(' ');
        if (space == std::string::npos || pair.find(' ', space + 1) != std::string::npos)
            core::fail(core::ExitCode::usage,
                       "data.shapes.held_out entry \"{}\" is not \"color shape\" (e.g. \"green triangle\") [{}]",
                       pair,
                       cfg_.source);
        options.held_out.emplace_back(pair.substr(0, space), pair.substr(space + 1));
    }
    const int64_t seq = cfg_.train.seq_len, patch = cfg_.model.vision.patch;
    image_train_ = std::make_unique<ImageTextSource>(options, data::ShapesSplit::train, seq, patch);
    image_val_ = std::make_unique<ImageTextSource>(options, data::ShapesSplit::val, seq, patch);
}

double Trainer::evaluate_images() {
    const auto& t = cfg_.train;
    // As evaluate(): the data-parallel ranks share the batches round-robin, and under expert parallelism a rank
    // without a batch in the last round repeats batch 0 and does not count it. The val split's rows are the same at
    // every evaluation, so the blind bound is exact for them: the mean over batches of (the blind nats of their
    // supervised caption tokens / their count), as the loss is the mean over batches of per-token means.
    double sum = 0.0, bound = 0.0;
    const int64_t p = data_size(), rounds = (t.eval_batches + p - 1) / p;
    for (int64_t round = 0; round < rounds; ++round) {
        const int64_t b = round * p + data_rank();
        if (b >= t.eval_batches && mesh_->size(parallel::MeshAxis::ep) == 1) break;
        ImageTextStats stats;
        image_val_->fill(
            (b < t.eval_batches ? b : 0) * t.batch_size, t.batch_size, inputs_, targets_, &eval_images_, &stats);
        model_->set_vision_batch(eval_images_);
        const double loss = model_->forward(inputs_, targets_, /*training=*/false);
        if (b >= t.eval_batches) continue;
        sum += loss;
        bound += stats.supervised > 0 ? stats.blind_nats / static_cast<double>(stats.supervised) : 0.0;
    }
    last_eval_bound_ = dp_sum(bound) / static_cast<double>(t.eval_batches);
    return dp_sum(sum) / static_cast<double>(t.eval_batches);
}

}  // namespace mt::train
