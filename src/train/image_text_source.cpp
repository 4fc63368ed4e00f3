// Rows of image-text samples, each a function of its index (train/image_text_source.h).
#include "train/image_text_source.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::train {

data::ShapesOptions shapes_options_of(const JobConfig& cfg) {
    const ShapesDataConfig& s = cfg.data.shapes;
    data::ShapesOptions options{
        .seed = static_cast<uint64_t>(s.seed >= 0 ? s.seed : cfg.run.seed),
        .max_objects = static_cast<int>(s.max_objects),
        .held_out = {},
        .val_size = s.val_size,
        .format = s.format,
        .stage = static_cast<int>(s.stage),
        .max_canvas = static_cast<int>(s.max_canvas),
    };
    for (const std::string& pair : s.held_out) {
        const size_t space = pair.find(' ');
        if (space == std::string::npos || pair.find(' ', space + 1) != std::string::npos)
            core::fail(core::ExitCode::usage,
                       "data.shapes.held_out entry \"{}\" is not \"color shape\" (e.g. \"green triangle\") [{}]",
                       pair,
                       cfg.source);
        options.held_out.emplace_back(pair.substr(0, space), pair.substr(space + 1));
    }
    return options;
}

std::vector<ShapesControl> shapes_controls_run(const JobConfig& cfg) {
    const bool comp_drawable = data::ShapesDataset(shapes_options_of(cfg)).comp_val_drawable();
    std::vector<ShapesControl> out;
    for (const ShapesControl c : cfg.data.shapes.controls)
        if (c != ShapesControl::comp_val || comp_drawable) out.push_back(c);
    return out;
}

data::ShapesView shapes_control_view(ShapesControl control) {
    using data::ShapesViewKind;
    switch (control) {
        case ShapesControl::zeroed:
            return {ShapesViewKind::zeroed};
        case ShapesControl::shuffled:
            return {ShapesViewKind::shuffled};
        case ShapesControl::flipped:
            return {ShapesViewKind::flipped};
        case ShapesControl::res112:
            return {ShapesViewKind::resized, 112};
        case ShapesControl::res336:
            return {ShapesViewKind::resized, 336};
        case ShapesControl::comp_val:
            return {};
    }
    return {};
}

ImageTextSource::ImageTextSource(const data::ShapesOptions& options,
                                 data::ShapesSplit split,
                                 int64_t seq,
                                 int64_t patch,
                                 const data::ShapesView& view)
    : batcher_(options, split), seq_(seq), patch_(patch) {
    batcher_.set_view(view);
    const int64_t longest = data::ShapesBatcher::max_sample_tokens(options, view);
    if (seq < longest)
        core::fail(
            core::ExitCode::usage,
            "train.seq_len = {} is shorter than the longest shapes sample of the {} view ({} tokens: the largest "
            "image's slots and a caption of data.shapes.max_objects objects); raise train.seq_len",
            seq,
            data::shapes_view_name(view),
            longest);
    MT_CHECK(patch == 14, "vision.patch = {}: the shapes images are cut into 14-pixel patches", patch);
    // Each row owns a block of as many samples as the shortest ones would fill, so rows never share a sample.
    per_row_ = std::max<int64_t>(1, seq / data::ShapesBatcher::min_sample_tokens(view) + 1);
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
    samples_.clear();
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
        for (data::MultimodalBatchSample s : row_.samples) {
            s.row = r;
            samples_.push_back(s);
        }
        if (stats == nullptr) continue;
        stats->supervised += row_.stats.supervised_tokens;
        stats->image_tokens += row_.stats.image_tokens;
        stats->text_tokens += row_.stats.text_tokens;
        stats->samples += row_.stats.samples;
        for (const data::MultimodalBatchSample& s : row_.samples) stats->blind_nats += s.reference_nats;
    }
    const int64_t values = 3 * patch_ * patch_;
    images->patches = core::Tensor::zeros({static_cast<int64_t>(patches.size()) / values, values}, core::DType::f32);
    std::copy(patches.begin(), patches.end(), images->patches.data<float>());
}

}  // namespace mt::train
