// The trainer's image-text data read from disk (data.format = "webdataset" or "image_jsonl"; docs/data.md
// "Image-text data"): the train and val sources, and the evaluation, which reports the plain val loss (the image-blind
// bound exists for the shapes set only).
#include "parallel/comm.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::disk_images_setup() {
    disk_train_ = std::make_unique<ImageDiskSource>(cfg_, cfg_.data.paths, /*shuffle=*/true, log_);
    if (!cfg_.data.val_paths.empty())
        disk_val_ = std::make_unique<ImageDiskSource>(cfg_, cfg_.data.val_paths, /*shuffle=*/false, log_);
}

double Trainer::evaluate_disk_images() {
    const auto& t = cfg_.train;
    // As evaluate(): the data-parallel ranks share the batches round-robin, and under expert parallelism a rank
    // without a batch in the last round repeats batch 0 and does not count it. Without data.val_paths the first
    // training rows are the val set: the same rows at every evaluation.
    ImageDiskSource& source = disk_val_ ? *disk_val_ : *disk_train_;
    double sum = 0.0;
    const int64_t p = data_size(), rounds = (t.eval_batches + p - 1) / p;
    for (int64_t round = 0; round < rounds; ++round) {
        const int64_t b = round * p + data_rank();
        if (b >= t.eval_batches && mesh_->size(parallel::MeshAxis::ep) == 1) break;
        source.fill((b < t.eval_batches ? b : 0) * t.batch_size, t.batch_size, inputs_, targets_, &eval_images_);
        const double loss = eval_forward(eval_images_);
        if (b < t.eval_batches) sum += loss;
    }
    return dp_sum(sum) / static_cast<double>(t.eval_batches);
}

}  // namespace mt::train
