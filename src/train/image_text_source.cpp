// Rows of image-text samples, each a function of its index (train/image_text_source.h).
#include "train/image_text_source.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>

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
    const auto n = static_cast<size_t>(rows);
    const int threads = std::max(1, std::min(omp_get_max_threads(), static_cast<int>(rows)));
    while (workers_.size() < static_cast<size_t>(threads)) workers_.push_back(batcher_);
    if (rows_.size() < n) rows_.resize(n);
    // An error may not leave an OpenMP region: the first one is kept and thrown after it.
    std::exception_ptr error;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; ++r) {
        // Row g starts at its own block of samples; the samples of the block that do not fit are never used.
        try {
            data::ShapesBatcher& worker = workers_[static_cast<size_t>(omp_get_thread_num())];
            worker.set_cursor((first_row + r) * per_row_);
            worker.next(1, seq_, &rows_[static_cast<size_t>(r)]);
        } catch (...) {
#pragma omp critical(image_text_fill)
            if (!error) error = std::current_exception();
        }
    }
    if (error) std::rethrow_exception(error);
    // Each row's patches go to their place in one tensor, copied in parallel: a shapes_gpu step carries ~200 MB of
    // f32 patches, whose serial gathering into a growing vector and a zeroed tensor cost as much as the GPU step.
    const int64_t values = 3 * patch_ * patch_;
    std::vector<int64_t> offset(n + 1, 0);
    for (size_t r = 0; r < n; ++r) offset[r + 1] = offset[r] + static_cast<int64_t>(rows_[r].images.patches.size());
    images->patches = core::Tensor::scratch({offset[n] / values, values}, core::DType::f32, core::Device::cpu);
    float* out = images->patches.data<float>();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t r = 0; r < rows; ++r) {
        const std::vector<float>& p = rows_[static_cast<size_t>(r)].images.patches;
        std::copy(p.begin(), p.end(), out + offset[static_cast<size_t>(r)]);
    }
    images->grids.clear();
    samples_.clear();
    int32_t* in = inputs.data<int32_t>();
    int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
        const data::MultimodalBatch& row = rows_[static_cast<size_t>(r)];
        MT_CHECK(row.samples.size() <= static_cast<size_t>(per_row_),
                 "a row of {} tokens took {} shapes samples, more than the {} its block holds",
                 seq_,
                 row.samples.size(),
                 per_row_);
        std::copy(row.inputs.begin(), row.inputs.end(), in + r * seq_);
        std::copy(row.targets.begin(), row.targets.end(), tg + r * seq_);
        for (const auto& g : row.images.grids) images->grids.push_back({g[0], g[1]});
        for (data::MultimodalBatchSample s : row.samples) {
            s.row = r;
            samples_.push_back(s);
        }
        if (stats == nullptr) continue;
        stats->supervised += row.stats.supervised_tokens;
        stats->image_tokens += row.stats.image_tokens;
        stats->text_tokens += row.stats.text_tokens;
        stats->samples += row.stats.samples;
        for (const data::MultimodalBatchSample& s : row.samples) stats->blind_nats += s.reference_nats;
    }
}

}  // namespace mt::train
