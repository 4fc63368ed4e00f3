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
#include "nn/vision/vision_batch.h"

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

class ImageTextSource {
   public:
    // seq: tokens per row (at least data::ShapesBatcher::max_sample_tokens, checked); patch: vision.patch.
    ImageTextSource(const data::ShapesOptions& options, data::ShapesSplit split, int64_t seq, int64_t patch);

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
    const data::ShapesDataset& dataset() const {
        return batcher_.dataset();
    }

   private:
    data::ShapesBatcher batcher_;
    data::ShapesSplit split_;
    int64_t seq_, patch_, per_row_;
    data::MultimodalBatch row_;  // one row's fill, reused
};

}  // namespace mt::train
