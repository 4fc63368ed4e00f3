// The image-text training data of `data.format = "shapes"` (docs/multimodal.md): rows of whole samples from the
// synthetic shapes set (data/shapes_batcher.h) with their images as the model's VisionBatch. Row g of a split's
// stream holds the samples g R, g R + 1, ... that fit in it (R = the most a row can hold), so every row is a function
// of its index alone: the trainer's sample arithmetic (data-parallel ranks, micro-batches, skipped data windows,
// exact resume) applies to rows unchanged, as it does to the token sampler's sequences.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "data/shapes_batcher.h"
#include "data/shapes_score.h"
#include "nn/vision/vision_batch.h"
#include "train/config.h"

namespace mt::train {

// What the rows of one fill hold besides tokens: the image-blind bound of their captions (multimodal.md §6) and the
// token counts of §8.
struct ImageTextStats {
    double blind_nats = 0.0;   // -sum of the blind log-probabilities of the supervised caption tokens
    int64_t supervised = 0;    // supervised targets
    int64_t image_tokens = 0;  // image slots
    int64_t text_tokens = 0;   // every other token of a sample
    int64_t samples = 0;
};

// One eval of a shapes view (docs/multimodal.md): the mean over the eval batches of the loss and of the blind bound per
// supervised token, and the greedy exact match and per-attribute accuracy of its samples.
struct ShapesEval {
    double loss = 0.0, bound = 0.0;
    data::ShapesScore score;
};

// The generator options of data.shapes.* (seed -1 resolved to run.seed); exit 2 naming data.shapes.held_out for an
// entry that is not "color shape".
data::ShapesOptions shapes_options_of(const JobConfig& cfg);
// The controls of data.shapes.controls that run: comp_val only where the stage can draw a held-out pair.
std::vector<ShapesControl> shapes_controls_run(const JobConfig& cfg);
// The view of a control (comp_val: the plain view of the comp-val split).
data::ShapesView shapes_control_view(ShapesControl control);

class ImageTextSource {
   public:
    // seq: tokens per row (at least data::ShapesBatcher::max_sample_tokens, checked); patch: vision.patch; view: what
    // every sample shows (data::ShapesView: the plain samples, the text-only twin, or an eval control).
    ImageTextSource(const data::ShapesOptions& options,
                    data::ShapesSplit split,
                    int64_t seq,
                    int64_t patch,
                    const data::ShapesView& view = {});

    // Rows [first_row, first_row + rows) of the stream: inputs and targets [rows, seq] i32 (host; targets -1 where
    // not supervised), the images of their image blocks in row-major order, and what the rows hold.
    void fill(int64_t first_row,
              int64_t rows,
              const core::Tensor& inputs,
              const core::Tensor& targets,
              nn::VisionBatch* images,
              ImageTextStats* stats = nullptr);
    int64_t samples_per_row() const {
        return per_row_;
    }
    // The samples of the last fill, in row order, their rows counted from its first row (the eval's exact match reads
    // each one's positions).
    const std::vector<data::MultimodalBatchSample>& last_samples() const {
        return samples_;
    }
    const data::ShapesDataset& dataset() const {
        return batcher_.dataset();
    }

   private:
    data::ShapesBatcher batcher_;
    int64_t seq_, patch_, per_row_;
    // Rows are rendered in parallel (OpenMP over rows; rendering is the data side's whole cost): one copy of the
    // batcher per thread, each row's batch kept until it is copied out in row order. Every row is a function of its
    // index, so the result does not depend on the thread count.
    std::vector<data::ShapesBatcher> workers_;
    std::vector<data::MultimodalBatch> rows_;
    std::vector<data::MultimodalBatchSample> samples_;
};

}  // namespace mt::train
