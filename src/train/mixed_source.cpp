// The mixed rows of `[[data.sources]]` (train/mixed_source.h): each source opened as the job would open it alone, and
// the per-row draw of the source.
#include "train/mixed_source.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace mt::train {

std::vector<double> mix_cumulative(const std::vector<DataSource>& sources) {
    MT_CHECK(!sources.empty(), "a mixture needs at least one source");
    double total = 0.0;
    for (const DataSource& s : sources) total += s.weight;
    std::vector<double> out;
    double run = 0.0;
    for (const DataSource& s : sources) {
        run += s.weight;
        out.push_back(run / total);
    }
    out.back() = 1.0;  // rounding must never leave a u in [0, 1) without a source
    return out;
}

int32_t mix_source_of_row(uint64_t seed, int64_t row, const std::vector<double>& cumulative) {
    static const uint64_t stream = core::hash_name("data.sources");
    // 53 random bits: the shares are exact to 2^-53, far below any sampling noise.
    const double u = static_cast<double>(core::rng_u64(seed, stream, static_cast<uint64_t>(row)) >> 11) * 0x1.0p-53;
    const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
    return static_cast<int32_t>(std::min<std::ptrdiff_t>(it - cumulative.begin(), std::ssize(cumulative) - 1));
}

MixedSource::MixedSource(const JobConfig& cfg, bool log)
    : cumulative_(mix_cumulative(cfg.data_sources)),
      seed_(static_cast<uint64_t>(cfg.run.seed)),
      seq_(cfg.train.seq_len),
      image_token_(cfg.model.vision.enabled() ? cfg.model.vision.image_token : -1) {
    for (const DataSource& s : cfg.data_sources) {
        JobConfig view = cfg;
        view.data = s.data;
        view.data_sources.clear();
        Part p;
        p.name = s.name;
        p.format = s.data.format;
        const DataConfig& d = s.data;
        if (d.format == "shapes") {
            const data::ShapesOptions options = shapes_options_of(view);
            const data::ShapesView plain{d.shapes.text_only ? data::ShapesViewKind::text_only
                                                            : data::ShapesViewKind::plain};
            const int64_t patch = cfg.model.vision.patch;
            p.shapes = std::make_unique<ImageTextSource>(options, data::ShapesSplit::train, seq_, patch, plain);
            p.shapes_val = std::make_unique<ImageTextSource>(options, data::ShapesSplit::val, seq_, patch, plain);
        } else if (view.data.images_on_disk()) {
            p.disk = std::make_unique<ImageDiskSource>(view, d.paths, /*shuffle=*/true, log);
            if (!d.val_paths.empty())
                p.disk_val = std::make_unique<ImageDiskSource>(view, d.val_paths, /*shuffle=*/false, log);
        } else {
            p.tokens = data::token_source_open(d.format, d.paths, cfg.model.vocab_size);
            p.sampler = std::make_unique<data::Sampler>(*p.tokens, seq_, seed_);
            if (!d.val_paths.empty()) {
                p.val_tokens = data::token_source_open(d.format, d.val_paths, cfg.model.vocab_size);
                p.val_sampler = std::make_unique<data::Sampler>(*p.val_tokens, seq_, seed_);
            }
        }
        parts_.push_back(std::move(p));
    }
}

std::vector<double> MixedSource::shares() const {
    std::vector<double> out;
    for (size_t i = 0; i < cumulative_.size(); ++i) out.push_back(cumulative_[i] - (i > 0 ? cumulative_[i - 1] : 0.0));
    return out;
}

std::string MixedSource::describe() const {
    std::string out;
    const std::vector<double> p = shares();
    for (size_t i = 0; i < parts_.size(); ++i)
        out += fmt::format("{}{} ({}, {:.3f})", i > 0 ? ", " : "", parts_[i].name, parts_[i].format, p[i]);
    return out;
}

void MixedSource::fill_rows(Part& part,
                            bool val,
                            int64_t first_row,
                            int64_t rows,
                            const core::Tensor& inputs,
                            const core::Tensor& targets,
                            nn::VisionBatch* images) {
    images->grids.clear();
    images->patches = core::Tensor();
    if (part.shapes) {
        (val ? *part.shapes_val : *part.shapes).fill(first_row, rows, inputs, targets, images);
    } else if (part.disk) {
        // Without val_paths, a disk source's val rows are its first training rows (as for the single source).
        (val && part.disk_val ? *part.disk_val : *part.disk).fill(first_row, rows, inputs, targets, images);
    } else if (val) {
        (part.val_sampler ? *part.val_sampler : *part.sampler).fill_sequential(first_row, rows, inputs, targets);
    } else {
        part.sampler->fill(first_row, rows, inputs, targets);
    }
}

void MixedSource::fill(int64_t first_row,
                       int64_t rows,
                       const core::Tensor& inputs,
                       const core::Tensor& targets,
                       nn::VisionBatch* images,
                       std::vector<int32_t>* sources) {
    MT_CHECK(inputs.shape() == core::Shape({rows, seq_}) && targets.shape() == inputs.shape(),
             "mixed fill: inputs {} and targets {} must be [{}, {}]",
             core::shape_str(inputs.shape()),
             core::shape_str(targets.shape()),
             rows,
             seq_);
    std::vector<float> patches;
    int64_t values = 0;
    images->grids.clear();
    if (sources != nullptr) sources->assign(static_cast<size_t>(rows), 0);
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t k = source_of_row(first_row + r);
        if (sources != nullptr) (*sources)[static_cast<size_t>(r)] = k;
        // The source's own row first_row + r: which rows a source reads depends on the row index alone.
        fill_rows(parts_[static_cast<size_t>(k)],
                  false,
                  first_row + r,
                  1,
                  inputs.slice(0, r, r + 1),
                  targets.slice(0, r, r + 1),
                  &row_images_);
        const Part& part = parts_[static_cast<size_t>(k)];
        if (part.sampler && image_token_ >= 0) {
            const int32_t* in = inputs.slice(0, r, r + 1).data<int32_t>();
            if (std::find(in, in + seq_, static_cast<int32_t>(image_token_)) != in + seq_)
                core::fail_hint(core::ExitCode::data,
                                "token files mixed with image sources must not hold the image slot id; re-tokenize "
                                "them without it",
                                "source \"{}\" ({}): row {} holds vision.image_token = {}",
                                part.name,
                                part.format,
                                first_row + r,
                                image_token_);
        }
        if (row_images_.empty()) continue;
        values = row_images_.patches.size(1);
        const float* p = row_images_.patches.data<float>();
        patches.insert(patches.end(), p, p + row_images_.patches.numel());
        images->grids.insert(images->grids.end(), row_images_.grids.begin(), row_images_.grids.end());
    }
    images->patches =
        values > 0 ? core::Tensor::zeros({static_cast<int64_t>(patches.size()) / values, values}, core::DType::f32)
                   : core::Tensor();
    if (values > 0) std::copy(patches.begin(), patches.end(), images->patches.data<float>());
}

void MixedSource::fill_val(int32_t source,
                           int64_t first_row,
                           int64_t rows,
                           const core::Tensor& inputs,
                           const core::Tensor& targets,
                           nn::VisionBatch* images) {
    fill_rows(parts_.at(static_cast<size_t>(source)), true, first_row, rows, inputs, targets, images);
}

}  // namespace mt::train
