// Packing image-caption samples from disk into rows, and filling them with tokens and patches (image_text_rows.h).
#include "data/image_text_rows.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "core/error.h"
#include "data/image_codec.h"
#include "data/sampler.h"

namespace mt::data {

ImageTextIds image_text_ids(const Tokenizer& tokenizer) {
    const auto v = static_cast<int32_t>(tokenizer.vocab_size());
    return ImageTextIds{
        .bos = v,
        .eot = tokenizer.eot_id(),
        .image = ImageTokenIds{.img_start = v + 1, .img_pad = v + 2, .img_end = v + 3, .pad = v + 4},
    };
}

ImageTextRows::ImageTextRows(const ImageTextDataset& dataset, const Tokenizer& tokenizer, ImageTextRowsOptions options)
    : dataset_(dataset), options_(options), ids_(image_text_ids(tokenizer)) {
    MT_CHECK(options_.threads >= 1, "image-text rows: {} fill threads, must be >= 1", options_.threads);
    const int64_t unit = 2 * options_.patch.patch;
    const int64_t largest = options_.max_pixels / (unit * unit);
    if (options_.seq < largest + 5)
        core::fail(core::ExitCode::usage,
                   "train.seq_len = {} cannot hold an image of vision.max_pixels = {} ({} image tokens) with its 4 "
                   "frame tokens and one caption token: raise train.seq_len to at least {} or lower vision.max_pixels",
                   options_.seq,
                   options_.max_pixels,
                   largest,
                   largest + 5);
    const int64_t n = dataset.size();
    captions_.resize(static_cast<size_t>(n));
    fit_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const ImageTextSample& s = dataset.sample(i);
        fit_[i] = image_fit_size(
            s.size.height, s.size.width, options_.min_pixels, options_.max_pixels, static_cast<int>(unit));
        std::vector<int32_t> caption = tokenizer.encode(s.caption);
        const int64_t room = options_.seq - 4 - (fit_[i].height / unit) * (fit_[i].width / unit);
        if (std::ssize(caption) > room) {
            caption.resize(static_cast<size_t>(room));
            ++truncated_;
        }
        captions_[i] = std::move(caption);
    }
    order_.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) order_[j] = options_.shuffle ? sampler_permute(j, n, options_.seed, 0) : j;
    // Greedy packing in that order: a sample opens a new row when it does not fit the current one.
    row_start_.push_back(0);
    int64_t used = 0;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t length = sample_tokens(order_[j]);
        if (used + length > options_.seq) {
            row_start_.push_back(j);
            used = 0;
        }
        used += length;
    }
    row_start_.push_back(n);
}

int64_t ImageTextRows::sample_tokens(int64_t i) const {
    const int64_t unit = 2 * options_.patch.patch;
    const ImageSize& f = fit_[static_cast<size_t>(i)];
    return 4 + (f.height / unit) * (f.width / unit) + std::ssize(captions_[static_cast<size_t>(i)]);
}

std::vector<int64_t> ImageTextRows::row_samples(int64_t g) const {
    MT_CHECK(g >= 0, "image-text row {} must be >= 0", g);
    const int64_t per_epoch = rows_per_epoch();
    const int64_t epoch = g / per_epoch, at = g % per_epoch;
    const int64_t r =
        options_.shuffle ? sampler_permute(at, per_epoch, options_.seed + 1, static_cast<uint64_t>(epoch)) : at;
    return std::vector<int64_t>(order_.begin() + row_start_[r], order_.begin() + row_start_[r + 1]);
}

int image_text_fill_threads(int64_t configured) {
    MT_CHECK(configured >= 0, "data.loader_threads = {} must be >= 0", configured);
    if (configured > 0) return static_cast<int>(configured);
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    return std::clamp(hardware / 2, 1, kImageTextFillThreadsAuto);
}

namespace {

// One sample of a fill: where its tokens and patches go, and what its image's preparation threw. The error is handled
// in sample order after the parallel part, where the serial fill met it.
struct FillJob {
    int64_t sample = 0, row = 0, offset = 0, length = 0;
    size_t patches_at = 0, patches_size = 0;  // its place in patches, as if every image of the fill decoded
    std::exception_ptr error;                 // thrown by reading, decoding or resizing: a bad sample, or a bug
    std::exception_ptr patch_error;           // thrown by patchifying (never a bad sample)
};

}  // namespace

void ImageTextRows::fill(int64_t first_row, int64_t rows, MultimodalBatch* out) const {
    MT_CHECK(out != nullptr && rows >= 1 && first_row >= 0, "image-text fill of {} rows at {}", rows, first_row);
    const int64_t seq = options_.seq;
    const int unit = 2 * options_.patch.patch;
    const size_t n = static_cast<size_t>(rows * seq);
    out->rows = rows;
    out->seq = seq;
    out->inputs.assign(n, ids_.image.pad);
    out->targets.assign(n, -1);
    out->modality.assign(n, 0);
    out->images.grids.clear();
    out->images.values_per_patch = image_patch_values(options_.patch.patch);
    out->samples.clear();
    out->stats = MultimodalBatchStats{};
    // 1. Where every sample goes (a bad sample keeps its span, as <pad>), its patches placed as if all decode.
    std::vector<FillJob> jobs;
    size_t patches = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t offset = 0;
        for (const int64_t i : row_samples(first_row + r)) {
            const ImageSize fit = fit_[static_cast<size_t>(i)];
            const auto size = static_cast<size_t>((fit.height / options_.patch.patch) *
                                                  (fit.width / options_.patch.patch) * out->images.values_per_patch);
            jobs.push_back(FillJob{.sample = i,
                                   .row = r,
                                   .offset = offset,
                                   .length = sample_tokens(i),
                                   .patches_at = patches,
                                   .patches_size = size,
                                   .error = nullptr,
                                   .patch_error = nullptr});
            offset += jobs.back().length;
            patches += size;
        }
        out->stats.pad_tokens += seq - offset;
    }
    // Not cleared first: every value up to `patches` is written below (or, a skipped image's, closed over and cut
    // off), so a reused buffer is neither zeroed nor, when large enough, grown (fresh pages are a serial page fault
    // each, ~2.4 MB per 448^2 image).
    out->images.patches.resize(patches);
    // 2. Read, decode, resize and patchify every image, options_.threads at a time. Each job writes only its own
    // patches and error, so the bytes do not depend on the thread count or the schedule. OpenMP, as in
    // ImageTextSource::fill, is the simplest correct pool here: the runtime keeps one team per calling thread (the
    // loader's background thread gets its own, beside the trainer's), the explicit num_threads sizes it whatever that
    // thread's defaults are, and the if clause keeps 1 thread serial. Called inside another parallel region (nothing
    // does), nesting is off and it runs on one thread: the same bytes. No exception may leave the region: each is kept
    // with its job.
    const auto count = static_cast<int64_t>(jobs.size());
    const int threads = static_cast<int>(std::min<int64_t>(options_.threads, std::max<int64_t>(1, count)));
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(dynamic, 1)
    for (int64_t j = 0; j < count; ++j) {
        FillJob& job = jobs[static_cast<size_t>(j)];
        const ImageSize fit = fit_[static_cast<size_t>(job.sample)];
        std::vector<uint8_t> rgb;
        try {
            const DecodedImage image = image_decode(dataset_.read_image(job.sample));
            const ImageTextSample& s = dataset_.sample(job.sample);
            if (image.height != s.size.height || image.width != s.size.width)
                core::fail(core::ExitCode::data,
                           "the image decodes to {}x{} pixels, its header said {}x{}",
                           image.height,
                           image.width,
                           s.size.height,
                           s.size.width);
            rgb = image_resize_bilinear(image.rgb.data(), image.height, image.width, fit.height, fit.width);
        } catch (...) {
            job.error = std::current_exception();
            continue;
        }
        try {
            image_patchify(
                rgb.data(), fit.height, fit.width, options_.patch, out->images.patches.data() + job.patches_at);
        } catch (...) {
            job.patch_error = std::current_exception();
        }
    }
    // 3. In sample order, as the serial fill: the first bad sample throws (or each is skipped and counted, once), the
    // tokens are written, and the patches of the good images close up over those of the bad ones.
    size_t kept = 0;
    std::vector<int32_t> sequence;
    for (const FillJob& job : jobs) {
        const int64_t i = job.sample;
        if (job.error) {
            try {
                std::rethrow_exception(job.error);
            } catch (const core::Error& e) {
                if (e.code() != core::ExitCode::data) throw;
                dataset_.report_bad(i, e);  // throws unless bad samples are skipped: the span stays <pad>
                continue;
            }
        }
        if (job.patch_error) std::rethrow_exception(job.patch_error);
        const ImageSize fit = fit_[static_cast<size_t>(i)];
        const int64_t m = (fit.height / unit) * (fit.width / unit);
        const std::vector<int32_t>& caption = captions_[static_cast<size_t>(i)];
        sequence.assign({ids_.bos, ids_.image.img_start});
        sequence.insert(sequence.end(), static_cast<size_t>(m), ids_.image.img_pad);
        sequence.push_back(ids_.image.img_end);
        sequence.insert(sequence.end(), caption.begin(), caption.end());
        sequence.push_back(ids_.eot);
        const ImageTokenMasks masks = image_tokens_sequence_masks(sequence, ids_.image);
        const size_t base = static_cast<size_t>(job.row * seq + job.offset);
        for (int64_t t = 0; t < job.length; ++t) {
            const size_t at = base + static_cast<size_t>(t);
            out->inputs[at] = sequence[static_cast<size_t>(t)];
            if (t + 1 == job.length) continue;
            const bool supervised = masks.loss_mask[static_cast<size_t>(t)] != 0;
            out->targets[at] = supervised ? sequence[static_cast<size_t>(t + 1)] : -1;
            out->modality[at] = masks.modality[static_cast<size_t>(t)];
            out->stats.supervised_tokens += supervised ? 1 : 0;
        }
        float* values = out->images.patches.data();
        if (kept != job.patches_at)  // after a skipped image: move down (kept < patches_at, so a forward copy)
            std::copy(values + job.patches_at, values + job.patches_at + job.patches_size, values + kept);
        kept += job.patches_size;
        out->images.grids.push_back({fit.height / options_.patch.patch, fit.width / options_.patch.patch});
        out->samples.push_back(MultimodalBatchSample{i, job.row, job.offset, job.length});
        out->stats.image_tokens += m;
        out->stats.text_tokens += job.length - m;
        out->stats.samples += 1;
        out->stats.images += 1;
    }
    out->images.patches.resize(kept);
}

}  // namespace mt::data
