// The model's pipeline-parallel entry points: the forward and backward of one of this rank's chunks on one
// micro-batch (the schedule and the send/recv between the stages are the trainer's, src/train/trainer_pipeline.cpp).
#include "nn/model.h"

namespace mt::nn {

double Model::forward_chunk(
    int chunk, const Tensor& ids, const Tensor& targets, const Tensor& input, bool training, bool recompute) {
    MT_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of a model part of {}", chunk, num_chunks());
    MT_CHECK(!cfg_.segments.enabled() && !attnres_, "pipeline chunks run without sequence segments or Block AttnRes");
    chunk_ = chunk;
    prepare_batch(ids, targets, training, !recompute);
    begin_pass(ids.size(0), 0, recompute);
    if (!chunk_has_embedding(chunk)) {
        MT_CHECK(input.defined() && input.shape() == x0_.shape(),
                 "chunk {} takes an input of shape {}, got {}",
                 chunk,
                 core::shape_str(x0_.shape()),
                 input.defined() ? core::shape_str(input.shape()) : "none");
        x0_.copy_from(input);
    }
    const double sum = pass_forward();
    return chunk_has_head(chunk) && counted_ > 0 ? sum / static_cast<double>(counted_) : 0.0;
}

void Model::backward_chunk(double loss_scale, const Tensor& d_output) {
    MT_CHECK(batch_ > 0, "backward before forward");
    MT_CHECK(chunk_has_head(chunk_) || (d_output.defined() && d_output.shape() == x0_.shape()),
             "chunk {}'s backward takes the gradient of its output, of shape {}",
             chunk_,
             core::shape_str(x0_.shape()));
    pass_backward(loss_scale, true, d_output);
}

const Tensor& Model::chunk_output() const {
    const int64_t hi = chunk_hi();
    return hi > chunk_lo() ? blocks_[static_cast<size_t>(hi) - 1]->output() : x0_;
}

}  // namespace mt::nn
