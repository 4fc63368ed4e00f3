// The rows of a `[[data.sources]]` mixture (docs/data.md "Mixed sources"): row g of the stream comes from source i with
// probability weight_i / sum(weight), drawn from (run.seed, g) alone, and is that source's own row g (a token window,
// a shapes row, an image-text row read from disk). Every row is so a function of its index alone, as each source's
// rows are, and the trainer's sample arithmetic (data-parallel ranks, micro-batches, skipped data windows, exact
// resume) applies unchanged. A source therefore reads the share weight_i / sum(weight) of its own stream's rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "data/sampler.h"
#include "data/token_source.h"
#include "nn/vision/vision_batch.h"
#include "train/config.h"
#include "train/image_disk_source.h"
#include "train/image_text_source.h"

namespace mt::train {

// The running sums of the sources' weights, normalised: cumulative[i] = (w_0 + ... + w_i) / sum(w), the last exactly 1.
std::vector<double> mix_cumulative(const std::vector<DataSource>& sources);
// The source of row `row` of the stream: the first i with u < cumulative[i], u uniform in [0, 1) from Philox keyed by
// (seed, the mixture's stream, row).
int32_t mix_source_of_row(uint64_t seed, int64_t row, const std::vector<double>& cumulative);

class MixedSource {
   public:
    // Opens every source of cfg.data_sources (training and validation streams), each with the job as it would run on
    // that source alone (config_source_view). Throws as the single sources do (exit 3 for bad data).
    MixedSource(const JobConfig& cfg, bool log);

    // Rows [first_row, first_row + rows) of the mixed stream: inputs and targets [rows, seq] i32 (host), the images of
    // the image rows in row order, and each row's source (sources: [rows]). A token row holding vision.image_token is
    // bad data (exit 3 naming the source): the model would look for an image that row does not have.
    void fill(int64_t first_row,
              int64_t rows,
              const core::Tensor& inputs,
              const core::Tensor& targets,
              nn::VisionBatch* images,
              std::vector<int32_t>* sources);
    // Validation rows [first_row, first_row + rows) of source `source` alone: its data.val_paths (else its own
    // training rows in order; the shapes val split for shapes).
    void fill_val(int32_t source,
                  int64_t first_row,
                  int64_t rows,
                  const core::Tensor& inputs,
                  const core::Tensor& targets,
                  nn::VisionBatch* images);

    int32_t source_of_row(int64_t row) const {
        return mix_source_of_row(seed_, row, cumulative_);
    }
    int32_t size() const {
        return static_cast<int32_t>(parts_.size());
    }
    // The probability of each source, weight_i / sum(weight).
    std::vector<double> shares() const;
    // A one-line summary of every source (name, format, share, size) for the start of the run.
    std::string describe() const;

   private:
    // One source's streams: the kind its format opens, for training and validation.
    struct Part {
        std::string name, format;
        std::unique_ptr<data::TokenSource> tokens, val_tokens;
        std::unique_ptr<data::Sampler> sampler, val_sampler;
        std::unique_ptr<ImageTextSource> shapes, shapes_val;
        std::unique_ptr<ImageDiskSource> disk, disk_val;
    };
    void fill_rows(Part& part,
                   bool val,
                   int64_t first_row,
                   int64_t rows,
                   const core::Tensor& inputs,
                   const core::Tensor& targets,
                   nn::VisionBatch* images);

    std::vector<Part> parts_;
    std::vector<double> cumulative_;
    uint64_t seed_ = 0;
    int64_t seq_ = 0;
    int64_t image_token_ = -1;    // vision.image_token: a text row holding it would claim an image it does not have
    nn::VisionBatch row_images_;  // one row's images, reused
};

}  // namespace mt::train
