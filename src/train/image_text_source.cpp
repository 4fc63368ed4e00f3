// Rows of image-text samples, each a function of its index (train/image_text_source.h).
#include "train/image_text_source.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::train {

ImageTextSource::ImageTextSource(const data::ShapesOptions& options,
                                 data::ShapesSplit split,
                                 int64_t seq,
                                 int64_t patch)
    : batcher_(options, split), split_(split), seq_(seq), patch_(patch) {
    const int64_t longest = data::ShapesBatcher::max_sample_tokens(options);
    if (seq < longest)
        core::fail(core::ExitCode::usage,
                   "train.seq_len = {} is shorter than the longest shapes sample ({} tokens: a 336x336 image's 144 "
                   "slots and a caption of data.shapes.max_objects objects); raise train.seq_len",
                   seq,
                   longest);
    MT_CHECK(patch == 14, "vision.patch = {}: the shapes images are cut into 14-pixel patches", patch);
    // The shortest sample is a 112x112 image (16 slots) with a one-object caption: at most seq / that many per row.
    per_row_ = std::max<int64_t>(1, seq / 20 + 1);
}

void ImageTextSource::fill(int64_t first_row,
                           int64_t rows,
                           const core::Tensor& inputs,
                           const core::Tensor& targets,
                           nn::VisionBatch* images,
                           ImageTextStats* stats) {
    MT_CHECK(inputs.shape() == core::Shape({rows, seq_}) && targets.shape() == inputs.shape(),
             "image-text fill: inputs {} and targets {} must be [{}, {}]",
             core::shape_str(inputs.shape()),
             core::shape_str(targets.shape()),
             rows,
             seq_);
    std::vector<float> patches;
    images->grids.clear();
    int32_t* in = inputs.data<int32_t>();
    int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
        // Row g starts at its own block of samples; the samples of the block that do not fit are never used.
        batcher_.set_cursor((first_row + r) * per_row_);
        batcher_.next(1, seq_, &row_);
        MT_CHECK(row_.samples.size() <= static_cast<size_t>(per_row_),
                 "a row of {} tokens took {} shapes samples, more than the {} its block holds",
                 seq_,
                 row_.samples.size(),
                 per_row_);
        std::copy(row_.inputs.begin(), row_.inputs.end(), in + r * seq_);
        std::copy(row_.targets.begin(), row_.targets.end(), tg + r * seq_);
        patches.insert(patches.end(), row_.images.patches.begin(), row_.images.patches.end());
        for (const auto& g : row_.images.grids) images->grids.push_back({g[0], g[1]});
        if (stats == nullptr) continue;
        stats->supervised += row_.stats.supervised_tokens;
        stats->image_tokens += row_.stats.image_tokens;
        stats->text_tokens += row_.stats.text_tokens;
        stats->samples += row_.stats.samples;
        for (const data::MultimodalBatchSample& s : row_.samples) {
            const data::ShapesSample sample = batcher_.dataset().sample(split_, s.index);
            for (double lp : sample.blind_logprob) stats->blind_nats -= lp;
        }
    }
    const int64_t values = 3 * patch_ * patch_;
    images->patches = core::Tensor::zeros({static_cast<int64_t>(patches.size()) / values, values}, core::DType::f32);
    std::copy(patches.begin(), patches.end(), images->patches.data<float>());
}

}  // namespace mt::train
