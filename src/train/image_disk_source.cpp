// Image-text rows from tar shards or JSONL manifests, prepared by a loader thread (train/image_disk_source.h).
#include "train/image_disk_source.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mt::train {

ImageDiskSource::ImageDiskSource(const JobConfig& cfg, const std::vector<std::string>& paths, bool shuffle, bool log) {
    dataset_ = std::make_unique<data::ImageTextDataset>(
        cfg.data.format,
        paths,
        data::ImageTextDatasetOptions{.skip_bad_samples = cfg.data.skip_bad_samples, .log = log, .log_batches = true});
    const nn::VisionConfig& v = cfg.model.vision;
    data::ImageTextRowsOptions options;
    options.seq = cfg.train.seq_len;
    options.min_pixels = v.min_pixels;
    options.max_pixels = v.max_pixels;
    options.patch.patch = static_cast<int>(v.patch);
    options.shuffle = shuffle;
    options.seed = static_cast<uint64_t>(cfg.run.seed);
    options.threads = data::image_text_fill_threads(cfg.data.loader_threads);
    const auto tokenizer = data::tokenizer_open(cfg.data.tokenizer);
    rows_ = std::make_unique<data::ImageTextRows>(*dataset_, *tokenizer, options);
    data::ImageTextRows* rows = rows_.get();
    loader_ = std::make_unique<data::ImageTextLoader>(
        [rows](int64_t first_row, int64_t n, data::MultimodalBatch* out) { rows->fill(first_row, n, out); });
    if (log)
        fmt::print("moetrain: {} data: {} samples from {} file(s) in {} rows of {} tokens per epoch{}{}\n",
                   cfg.data.format,
                   dataset_->size(),
                   paths.size(),
                   rows_->rows_per_epoch(),
                   options.seq,
                   dataset_->skipped() > 0 ? fmt::format(", {} bad samples skipped", dataset_->skipped()) : "",
                   rows_->truncated_captions() > 0
                       ? fmt::format(", {} captions cut to fit a row", rows_->truncated_captions())
                       : "");
}

void ImageDiskSource::fill(int64_t first_row,
                           int64_t rows,
                           const core::Tensor& inputs,
                           const core::Tensor& targets,
                           nn::VisionBatch* images,
                           ImageTextStats* stats) {
    loader_->get(first_row, rows, &batch_);
    MT_CHECK(inputs.shape() == core::Shape({rows, batch_.seq}) && targets.shape() == inputs.shape(),
             "image-text fill: inputs {} and targets {} must be [{}, {}]",
             core::shape_str(inputs.shape()),
             core::shape_str(targets.shape()),
             rows,
             batch_.seq);
    data::multimodal_batch_check(batch_, rows_->ids().image);
    std::copy(batch_.inputs.begin(), batch_.inputs.end(), inputs.data<int32_t>());
    std::copy(batch_.targets.begin(), batch_.targets.end(), targets.data<int32_t>());
    images->grids.clear();
    for (const auto& g : batch_.images.grids) images->grids.push_back({g[0], g[1]});
    const int64_t values = batch_.images.values_per_patch;
    // Uninitialised (as ImageTextSource::fill's): every value is overwritten by the copy, so zeroing ~385 MB first
    // at shapes_gpu size would only double the trainer thread's work.
    images->patches = core::Tensor::scratch(
        {static_cast<int64_t>(batch_.images.patches.size()) / values, values}, core::DType::f32, core::Device::cpu);
    std::copy(batch_.images.patches.begin(), batch_.images.patches.end(), images->patches.data<float>());
    if (stats == nullptr) return;
    stats->supervised += batch_.stats.supervised_tokens;
    stats->image_tokens += batch_.stats.image_tokens;
    stats->text_tokens += batch_.stats.text_tokens;
    stats->samples += batch_.stats.samples;
}

}  // namespace mt::train
