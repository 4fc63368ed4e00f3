// The image+text batch the trainer takes (multimodal.md §3): token rows with the loss mask already applied to the
// targets, the per-token modality id, and the patches of every image block in the rows. Any image-text source fills
// this one struct, so the model's splice and the loss never depend on where the data came from.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "data/image_tokens.h"

namespace mt::data {

// The images of a batch, packed NaViT-style into one patch sequence (the ViT's cu_seqlens follow from grids).
struct ImageBatch {
    // [sum_i h_i * w_i, values_per_patch]: image after image, each in raster patch order (image_patchify).
    std::vector<float> patches;
    int64_t values_per_patch = 0;  // patch * patch * 3 (588)
    // (h, w) of each image in patches, both even; image i fills (h_i / 2)(w_i / 2) <img_pad> slots.
    std::vector<std::array<int64_t, 2>> grids;
};

// Token counts of one batch, for the image-token share and throughput logs (multimodal.md §8).
struct MultimodalBatchStats {
    int64_t image_tokens = 0;       // positions whose input is an image slot (modality 1)
    int64_t text_tokens = 0;        // other positions that belong to a sample (<bos>, <img_start>, <img_end>, text)
    int64_t pad_tokens = 0;         // filler at the end of rows
    int64_t supervised_tokens = 0;  // targets != -1
    int64_t samples = 0;
    int64_t images = 0;
};

// Where one sample sits in the batch: its source index (a shapes index, a document id), its row and first column,
// and its length in tokens. Eval code uses it to score samples one by one.
struct MultimodalBatchSample {
    int64_t index = 0;
    int64_t row = 0;
    int64_t offset = 0;
    int64_t length = 0;
    // The source's reference loss of the sample, summed over its supervised tokens, where it has one (the shapes
    // set's exact image-blind bound: -sum of the blind log-probabilities of its text), else 0.
    double reference_nats = 0.0;
};

struct MultimodalBatch {
    int64_t rows = 0;
    int64_t seq = 0;
    std::vector<int32_t> inputs;                 // [rows * seq]
    std::vector<int32_t> targets;                // [rows * seq]; -1 where not supervised (the loss mask of §3 applied)
    std::vector<uint8_t> modality;               // [rows * seq]; 0 text, 1 image slot
    ImageBatch images;                           // in the order of the image blocks in the rows, row-major
    std::vector<MultimodalBatchSample> samples;  // in batch order
    MultimodalBatchStats stats;
};

// Checks that a batch is self-consistent and fails with MT_CHECK naming the row and column when not: sizes match
// rows * seq; modality is 1 exactly at <img_pad> inputs; image blocks are closed inside their row; the k-th block
// in row-major order has (h_k / 2)(w_k / 2) slots with even h_k, w_k; patches hold sum h_k w_k patches; no target
// is an image id or sits at an image slot. What the model's splice relies on, checked once where the batch is made.
// @param[in] batch  the batch
// @param[in] ids    the image ids of the vocabulary
void multimodal_batch_check(const MultimodalBatch& batch, const ImageTokenIds& ids);

}  // namespace mt::data
