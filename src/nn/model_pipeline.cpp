// The forward and backward of one of this rank's chunks on one micro-batch: the pipeline's entry points (the
// schedule and the send/recv between the stages are the trainer's, src/train/trainer_pipeline.cpp), and without
// pipeline parallelism Model::forward and Model::backward, which run the one chunk of every layer.
//
// With sequence segments (long_context.md §4) a chunk runs its micro-batch's segments one after another, each with
// the caches of the ones before it: its input and output are the whole sequence's ([B T, C], the rows of each
// segment copied in and out), and its backward runs the segments last first, re-running
// each one's forward but the last's, with its slice of the output's gradient. Only one segment's activations are
// held; what crosses a stage boundary is the same as without segments.
#include "nn/model.h"

namespace mt::nn {

namespace {

// The rows of a chunk's input and output: the micro-batch's tokens this rank holds (1 / cp of each sequence under
// context parallelism, then 1 / tp of those under sequence parallelism).
int64_t chunk_rows(const TensorParallel& tp, const ContextParallel& cp, int64_t batch, int64_t total_seq) {
    return tp.stream_rows(batch * (cp.active() ? total_seq / cp.size : total_seq));
}

// Segment j's first row in a chunk's input and output: under context parallelism every segment is zigzagged on its
// own, so a rank's rows are its rows of segment 0, then of segment 1, ... (1 / cp of each).
int64_t local_first(const std::vector<int64_t>& bounds, const ContextParallel& cp, int64_t j) {
    const int64_t first = bounds[static_cast<size_t>(j)];
    return cp.active() ? first / cp.size : first;
}

// The [B, T, C] view of a [B T, C] tensor of `batch` rows.
Tensor by_time(const Tensor& t, int64_t batch) {
    return t.reshape({batch, t.size(0) / batch, t.size(1)});
}

}  // namespace

double Model::forward_chunk(
    int chunk, const Tensor& ids, const Tensor& targets, const Tensor& input, bool training, bool recompute) {
    MT_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of a model part of {}", chunk, num_chunks());
    MT_CHECK(!attnres_ || num_chunks() == 1 || attnres_carry_, "Block AttnRes over pipeline chunks needs a carry");
    drop_graphs();  // an eager forward may move the buffers a captured step uses
    chunk_ = chunk;
    prepare_batch(ids, targets, training, !recompute);
    const int64_t batch = ids.size(0), segments = static_cast<int64_t>(bounds_.size()) - 1;
    MT_CHECK(segments == 1 || num_chunks() == 1 || (!attnres_ && !tp_.active()),
             "sequence segments in a pipeline chunk run without Block AttnRes and tensor parallelism");
    const bool takes_input = !chunk_has_embedding(chunk) && !attnres_;
    const std::vector<int64_t> whole = {chunk_rows(tp_, cp_, batch, total_seq_), cfg_.d_model};
    if (takes_input)
        MT_CHECK(input.defined() && input.shape() == whole,
                 "chunk {} takes an input of shape {}, got {}",
                 chunk,
                 core::shape_str(whole),
                 input.defined() ? core::shape_str(input.shape()) : "none");
    seq_input_ = input;
    if (segments > 1 && !chunk_has_head(chunk) && (!seq_output_.defined() || seq_output_.shape() != whole))
        seq_output_ = Tensor::zeros(whole, precision_.compute, precision_.device);
    double sum = 0.0;
    for (int64_t j = 0; j < segments; ++j) {
        // The trainer's re-run of a chunk whose caches another micro-batch has overwritten since is a first
        // forward again (each segment rebuilds its caches), without counting the routing twice.
        begin_pass(batch, j, segments == 1 && recompute, !recompute);
        if (takes_input) segment_input(j);
        sum += pass_forward();
        if (segments > 1 && !chunk_has_head(chunk)) {
            copy_time_rows(
                by_time(seq_output_, batch), local_first(bounds_, cp_, j), by_time(last_output(), batch), 0, seq_);
        }
    }
    return chunk_has_head(chunk) && counted_ > 0 ? sum / static_cast<double>(counted_) : 0.0;
}

void Model::segment_input(int64_t j) {
    const int64_t segments = static_cast<int64_t>(bounds_.size()) - 1;
    if (segments == 1) {
        x0_.copy_from(seq_input_);
        return;
    }
    copy_time_rows(by_time(x0_, batch_), 0, by_time(seq_input_, batch_), local_first(bounds_, cp_, j), seq_);
}

void Model::backward_chunk(double loss_scale, const Tensor& d_output) {
    MT_CHECK(batch_ > 0, "backward before forward");
    const std::vector<int64_t> whole = {chunk_rows(tp_, cp_, batch_, total_seq_), cfg_.d_model};
    MT_CHECK(chunk_has_head(chunk_) || attnres_ || (d_output.defined() && d_output.shape() == whole),
             "chunk {}'s backward takes the gradient of its output, of shape {}",
             chunk_,
             core::shape_str(whole));
    const int64_t segments = static_cast<int64_t>(bounds_.size()) - 1;
    if (segments == 1) {
        pass_backward(loss_scale, true, d_output);
        return;
    }
    const bool embedding = chunk_has_embedding(chunk_), head = chunk_has_head(chunk_);
    if (!embedding && (!seq_input_grad_.defined() || seq_input_grad_.shape() != whole))
        seq_input_grad_ = Tensor::zeros(whole, precision_.compute, precision_.device);
    for (int64_t j = segments - 1; j >= 0; --j) {
        // Segments backward, last first: each but the last runs its forward again (the caches of the earlier ones
        // are kept; the later ones' gradients are waiting in the layers).
        if (j < segments - 1) {
            begin_pass(batch_, j, true);
            if (!embedding) segment_input(j);
            pass_forward();
        }
        const int64_t first = local_first(bounds_, cp_, j);
        const Tensor d_segment =
            head ? Tensor() : time_rows(by_time(d_output, batch_), first, seq_).reshape({batch_ * seq_, cfg_.d_model});
        pass_backward(loss_scale, j == 0, d_segment);
        if (!embedding) copy_time_rows(by_time(seq_input_grad_, batch_), first, by_time(input_grad_, batch_), 0, seq_);
    }
    input_grad_ = embedding ? Tensor() : seq_input_grad_;
}

const Tensor& Model::last_output() const {
    const int64_t hi = chunk_hi();
    return hi > chunk_lo() ? blocks_[static_cast<size_t>(hi) - 1]->output() : x0_;
}

const Tensor& Model::chunk_output() const {
    return bounds_.size() > 2 ? seq_output_ : last_output();
}

}  // namespace mt::nn
