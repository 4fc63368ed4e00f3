// Rows of image-caption samples from disk (image_text_dataset.h) for the trainer: each sample becomes
// `<bos> <img_start> [m x <img_pad>] <img_end> caption <eot>`, samples are packed whole into rows of seq tokens once,
// up front, from their lengths (m follows from the image header's size), and row g of the stream is a function of g
// alone: epoch g / R (R rows per epoch) reads every row once, in an order shuffled per epoch. Filling rows decodes,
// resizes (multimodal.md §1) and patchifies their images, on data.loader_threads threads, the same bytes for any count.
#pragma once

#include <cstdint>
#include <vector>

#include "data/image_prep.h"
#include "data/image_text_dataset.h"
#include "data/image_tokens.h"
#include "data/multimodal_batch.h"
#include "data/tokenizer.h"

namespace mt::data {

// The special ids of image-text data on disk, appended after the tokenizer's vocabulary V: <bos> = V, <img_start> =
// V + 1, <img_pad> = V + 2 (vision.image_token), <img_end> = V + 3, <pad> = V + 4 (the filler at the end of rows).
// Captions end with the tokenizer's own EOT. model.vocab_size must be at least V + 5.
inline constexpr int64_t kImageTextSpecialTokens = 5;

struct ImageTextIds {
    int32_t bos = -1;
    int32_t eot = -1;
    ImageTokenIds image;  // img_start, img_pad, img_end, pad
};

// The ids above for a tokenizer.
// @param[in] tokenizer  data.tokenizer
ImageTextIds image_text_ids(const Tokenizer& tokenizer);

struct ImageTextRowsOptions {
    int64_t seq = 0;                 // tokens per row (train.seq_len)
    int64_t min_pixels = 112 * 112;  // vision.min_pixels
    int64_t max_pixels = 448 * 448;  // vision.max_pixels
    ImagePatchOptions patch;         // vision.patch, normalisation
    bool shuffle = true;             // false: samples and rows in file order (validation)
    uint64_t seed = 0;               // run.seed: the sample order and each epoch's row order
    int threads = 1;                 // images prepared at once by a fill (image_text_fill_threads), >= 1
};

// The most threads data.loader_threads = 0 picks.
inline constexpr int kImageTextFillThreadsAuto = 8;

// The threads a fill prepares images on for data.loader_threads: the value itself when > 0; 0 picks half the
// hardware threads (the other half are left to the trainer's own CPU work: its OpenMP ops, the CUDA and NCCL host
// threads), at least 1 and at most kImageTextFillThreadsAuto (8 threads at ~110 PNG images/s each cover a GPU step
// that takes ~160 images per 250 ms). Each rank's loaders use this many, whatever the other ranks on the node do.
// @param[in] configured  data.loader_threads, >= 0
int image_text_fill_threads(int64_t configured);

class ImageTextRows {
   public:
    // Tokenizes every caption, sizes every image, and packs the samples into rows. In shuffled mode the samples are
    // packed in one fixed pseudo-random order (sampler_permute, epoch 0); epoch e then reads the rows in the order
    // sampler_permute(., rows, seed + 1, e). A sample never splits across rows; one longer than a row has its caption
    // cut to fit (counted in truncated_captions()). Throws Error(ExitCode::usage) when seq cannot hold the largest
    // image max_pixels allows plus 5 tokens.
    // @param[in] dataset    the indexed samples; must outlive this object
    // @param[in] tokenizer  encodes the captions (only during construction)
    // @param[in] options    row length, resize limits, patch options, shuffling
    ImageTextRows(const ImageTextDataset& dataset, const Tokenizer& tokenizer, ImageTextRowsOptions options);

    // Rows in one epoch (R).
    int64_t rows_per_epoch() const {
        return std::ssize(row_start_) - 1;
    }
    // The samples of stream row g, in row order.
    // @param[in] g  any row index >= 0
    std::vector<int64_t> row_samples(int64_t g) const;
    // The tokens of sample i: bos, image block, caption, eot.
    int64_t sample_tokens(int64_t i) const;
    int64_t truncated_captions() const {
        return truncated_;
    }
    const ImageTextIds& ids() const {
        return ids_;
    }

    // Fills stream rows [first_row, first_row + rows) into out (overwritten, buffers reused): tokens, targets masked
    // by image_tokens_sequence_masks (the last position of a sample, input <eot>, is not supervised: the next sample
    // is independent), the modality, and the images in block order, each decoded, resized to image_fit_size within
    // [min_pixels, max_pixels] with image_resize_bilinear and patchified. A sample whose image does not decode goes
    // to the dataset's report_bad: it throws (exit 3 naming the shard and key), or, skipping, the sample's span is
    // left as <pad> inputs with no target. The images are read, decoded, resized and patchified options.threads at a
    // time (OpenMP); bad samples are then handled in sample order, so the first bad one throws and the skipped ones are
    // counted as the serial fill does. The result depends only on (first_row, rows), not on the thread count:
    // thread-safe and deterministic, so a loader thread may call it ahead of time.
    // @param[in]  first_row  stream row of out's row 0
    // @param[in]  rows       >= 1
    // @param[out] out        the batch
    void fill(int64_t first_row, int64_t rows, MultimodalBatch* out) const;

   private:
    const ImageTextDataset& dataset_;
    ImageTextRowsOptions options_;
    ImageTextIds ids_;
    std::vector<std::vector<int32_t>> captions_;  // [sample] caption tokens, cut to fit a row
    std::vector<ImageSize> fit_;                  // [sample] the size its image is resized to
    std::vector<int64_t> order_;                  // packing order: order_[j] is the j-th sample packed
    std::vector<int64_t> row_start_;              // row r holds order_[row_start_[r] .. row_start_[r + 1])
    int64_t truncated_ = 0;
};

}  // namespace mt::data
