// The image-text training data read from disk (data.format = "webdataset" or "image_jsonl"; docs/data.md
// "Image-text data"): the dataset's index, its rows (data/image_text_rows.h) and a loader thread that prepares the next
// batches while the trainer computes. Row g of the stream is a function of g alone, as with the shapes source
// (train/image_text_source.h), so data-parallel ranks, micro-batches, skipped windows and exact resume apply
// unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/image_text_dataset.h"
#include "data/image_text_loader.h"
#include "data/image_text_rows.h"
#include "nn/vision/vision_batch.h"
#include "train/config.h"
#include "train/image_text_source.h"

namespace mt::train {

class ImageDiskSource {
   public:
    // Indexes the files, packs the rows and starts the loader thread. Throws Error(ExitCode::data) for bad data (see
    // data::ImageTextDataset) and Error(ExitCode::usage) for rows too short for the largest image.
    // @param[in] cfg      the job (data.format, data.tokenizer, data.skip_bad_samples, data.loader_threads,
    //                     train.seq_len, vision.*, run.seed)
    // @param[in] paths    data.paths or data.val_paths
    // @param[in] shuffle  true for training (rows shuffled per epoch), false for validation (file order)
    // @param[in] log      print the summary line and the bad-sample warnings (rank 0)
    ImageDiskSource(const JobConfig& cfg, const std::vector<std::string>& paths, bool shuffle, bool log);

    // Rows [first_row, first_row + rows) of the stream, as ImageTextSource::fill: inputs and targets [rows, seq] i32
    // (targets -1 where not supervised), their images, and their token counts (blind_nats stays 0: there is no
    // image-blind bound for real data).
    void fill(int64_t first_row,
              int64_t rows,
              const core::Tensor& inputs,
              const core::Tensor& targets,
              nn::VisionBatch* images,
              ImageTextStats* stats = nullptr);

    const data::ImageTextDataset& dataset() const {
        return *dataset_;
    }
    const data::ImageTextRows& rows() const {
        return *rows_;
    }

   private:
    std::unique_ptr<data::ImageTextDataset> dataset_;
    std::unique_ptr<data::ImageTextRows> rows_;
    std::unique_ptr<data::ImageTextLoader> loader_;
    data::MultimodalBatch batch_;
};

}  // namespace mt::train
