// The parallel fill of image-text rows from disk (data/image_text_rows.h, data.loader_threads): for both formats, any
// thread count, into a new or a reused batch, gives the serial fill's bytes, the same skipped samples with the same
// counted warnings, and the same error (the first bad sample in row order, naming its shard or manifest line and key),
// also from the loader thread, whose buffers the caller hands back.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "data/image_codec.h"
#include "data/image_text_loader.h"
#include "data/image_text_rows.h"
#include "data/image_text_write.h"
#include "data/shapes.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::quiet;
using testing::ScratchDir;

constexpr int64_t kSamples = 24;
constexpr int kThreadCounts[] = {2, 3, 4, 7};

// kSamples shapes scenes at four sizes (each resized into 56^2..112^2), in tar shards of 8 and beside a manifest.
// Sample 5 is a PNG with damaged pixel data and sample 17 a JPEG cut short: their headers read, so only the fill
// finds them.
ImageTextWriteResult write_samples(const ScratchDir& dir) {
    ImageTextWriteOptions o;
    o.out_dir = dir.file("data");
    o.per_shard = 8;
    o.manifest = true;
    ImageTextWriter writer(o);
    const ShapesDataset shapes{ShapesOptions{}};
    const int sides[][2] = {{112, 112}, {168, 224}, {224, 168}, {336, 280}};
    for (int64_t i = 0; i < kSamples; ++i) {
        const ShapesSample s = shapes.sample(ShapesSplit::train, static_cast<uint64_t>(i));
        const int h = sides[i % 4][0], w = sides[i % 4][1];
        const ShapesImage image = shapes_render(s.scene, h, w);
        const std::string key = fmt::format("{:04d}", i), caption = fmt::format("sample {}", i);
        if (i == 5) {
            std::vector<uint8_t> png = image_encode_png(image.rgb, h, w);
            png[png.size() - 20] ^= 0x40;
            writer.add_encoded(key, png, ImageFormat::png, caption);
        } else if (i == 17) {
            std::vector<uint8_t> jpeg = image_encode_jpeg(image.rgb, h, w);
            jpeg.resize(jpeg.size() / 2);
            writer.add_encoded(key, jpeg, ImageFormat::jpeg, caption);
        } else {
            writer.add_rgb(key, image.rgb, h, w, caption);
        }
    }
    return writer.finish();
}

ImageTextRowsOptions rows_options(int threads) {
    ImageTextRowsOptions o;
    o.seq = 64;  // two or three samples to a row
    o.min_pixels = 56 * 56;
    o.max_pixels = 112 * 112;
    o.seed = 3;
    o.threads = threads;
    return o;
}

void expect_bitwise(const MultimodalBatch& a, const MultimodalBatch& b, const std::string& what) {
    EXPECT_EQ(a.inputs, b.inputs) << what;
    EXPECT_EQ(a.targets, b.targets) << what;
    EXPECT_EQ(a.modality, b.modality) << what;
    EXPECT_EQ(a.images.grids, b.images.grids) << what;
    ASSERT_EQ(a.images.patches.size(), b.images.patches.size()) << what;
    EXPECT_EQ(std::memcmp(a.images.patches.data(), b.images.patches.data(), a.images.patches.size() * sizeof(float)), 0)
        << what;
    ASSERT_EQ(a.samples.size(), b.samples.size()) << what;
    for (size_t k = 0; k < a.samples.size(); ++k) {
        EXPECT_EQ(a.samples[k].index, b.samples[k].index) << what;
        EXPECT_EQ(a.samples[k].offset, b.samples[k].offset) << what;
    }
    EXPECT_EQ(a.stats.image_tokens, b.stats.image_tokens) << what;
    EXPECT_EQ(a.stats.text_tokens, b.stats.text_tokens) << what;
    EXPECT_EQ(a.stats.pad_tokens, b.stats.pad_tokens) << what;
    EXPECT_EQ(a.stats.supervised_tokens, b.stats.supervised_tokens) << what;
    EXPECT_EQ(a.stats.images, b.stats.images) << what;
}

// The patches of a batch's images made one by one from their files: what any fill must hold.
std::vector<float> reference_patches(const ImageTextDataset& dataset, const MultimodalBatch& batch) {
    const ImageTextRowsOptions o = rows_options(1);
    std::vector<float> out;
    for (const MultimodalBatchSample& s : batch.samples) {
        const DecodedImage image = image_decode(dataset.read_image(s.index));
        const ImageSize fit = image_fit_size(image.height, image.width, o.min_pixels, o.max_pixels);
        const std::vector<uint8_t> rgb =
            image_resize_bilinear(image.rgb.data(), image.height, image.width, fit.height, fit.width);
        const size_t at = out.size();
        out.resize(at + static_cast<size_t>((fit.height / 14) * (fit.width / 14) * image_patch_values()));
        image_patchify(rgb.data(), fit.height, fit.width, o.patch, out.data() + at);
    }
    return out;
}

// What one fill of `rows` rows from row 0 gives with a fresh dataset: the batch, the warnings printed, the samples
// skipped, and the error's message ("" when none). `dirty`: fill into a copy of it (a reused batch) instead of a new
// one.
struct Outcome {
    MultimodalBatch batch;
    std::string warnings, error;
    int64_t skipped = 0;
};

Outcome fill_fresh(const std::string& format,
                   const std::vector<std::string>& paths,
                   bool skip,
                   int threads,
                   int64_t rows,
                   const MultimodalBatch* dirty = nullptr) {
    const ImageTextDataset dataset(format, paths, quiet(skip));
    const ImageTextRows data(dataset, ByteTokenizer(), rows_options(threads));
    Outcome out;
    if (dirty != nullptr) out.batch = *dirty;
    ::testing::internal::CaptureStdout();
    try {
        data.fill(0, rows, &out.batch);
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::data) << e.what();
        out.error = e.what();
    }
    std::fflush(stdout);
    out.warnings = ::testing::internal::GetCapturedStdout();
    out.skipped = dataset.skipped();
    return out;
}

class ImageTextRowsParallel : public ::testing::TestWithParam<std::string> {
   protected:
    void SetUp() override {
        written_ = write_samples(dir_);
        paths_ = GetParam() == "webdataset" ? written_.shards : std::vector<std::string>{written_.manifest};
        const ImageTextDataset dataset(GetParam(), paths_, quiet());
        const ImageTextRows data(dataset, ByteTokenizer(), rows_options(1));
        per_epoch_ = data.rows_per_epoch();
        // Every row of epoch 0 and three of epoch 1: each bad sample is met, and some twice.
        rows_ = per_epoch_ + 3;
        for (int64_t g = 0; g < rows_; ++g)
            for (const int64_t i : data.row_samples(g)) {
                const bool bad = i == 5 || i == 17;
                if (bad && first_bad_ < 0) first_bad_ = i;
                good_slots_ += bad ? 0 : 1;
            }
        first_bad_where_ = dataset.where(first_bad_);
    }
    ScratchDir dir_;
    ImageTextWriteResult written_;
    std::vector<std::string> paths_;
    int64_t per_epoch_ = 0, rows_ = 0, first_bad_ = -1, good_slots_ = 0;
    std::string first_bad_where_;
};

TEST_P(ImageTextRowsParallel, SkippingFillIsTheSerialFillBitwise) {
    ASSERT_GT(per_epoch_, 6);
    const Outcome serial = fill_fresh(GetParam(), paths_, true, 1, rows_);
    ASSERT_EQ(serial.error, "");
    EXPECT_EQ(serial.skipped, 2);
    EXPECT_EQ(serial.batch.stats.images, good_slots_);
    EXPECT_NE(serial.warnings.find("skipped bad sample (1 so far)"), std::string::npos) << serial.warnings;
    EXPECT_NE(serial.warnings.find("skipped bad sample (2 so far)"), std::string::npos) << serial.warnings;
    EXPECT_EQ(serial.warnings.find("(3 so far)"), std::string::npos) << serial.warnings;
    EXPECT_LT(serial.warnings.find(first_bad_where_), serial.warnings.find("(2 so far)")) << serial.warnings;
    // The good images' patches in sample order, closed up over the skipped ones.
    const std::vector<float> want = reference_patches(ImageTextDataset(GetParam(), paths_, quiet(true)), serial.batch);
    ASSERT_EQ(serial.batch.images.patches.size(), want.size());
    EXPECT_EQ(std::memcmp(serial.batch.images.patches.data(), want.data(), want.size() * sizeof(float)), 0);
    for (const int threads : kThreadCounts) {
        const Outcome parallel = fill_fresh(GetParam(), paths_, true, threads, rows_);
        const std::string what = fmt::format("{} threads", threads);
        ASSERT_EQ(parallel.error, "") << what;
        expect_bitwise(serial.batch, parallel.batch, what);
        EXPECT_EQ(parallel.skipped, 2) << what;
        EXPECT_EQ(parallel.warnings, serial.warnings) << what;  // the same counted warnings, in the same order
    }
    // Into a reused batch whose buffers hold other values (NaN patches, more of them): nothing stale is left.
    MultimodalBatch dirty = serial.batch;
    dirty.images.patches.assign(dirty.images.patches.size() + 5000, std::numeric_limits<float>::quiet_NaN());
    dirty.images.grids.resize(3);
    for (const int threads : {1, 4}) {
        const Outcome reused = fill_fresh(GetParam(), paths_, true, threads, rows_, &dirty);
        expect_bitwise(serial.batch, reused.batch, fmt::format("reused batch, {} threads", threads));
    }
}

TEST_P(ImageTextRowsParallel, FillWithoutBadSamplesIsTheSerialFillBitwise) {
    // The rows of epoch 0 that hold no bad sample, filled one at a time and all together, strictly.
    const ImageTextDataset dataset(GetParam(), paths_, quiet());
    const ImageTextRows serial(dataset, ByteTokenizer(), rows_options(1));
    int64_t good = 0;
    for (int64_t g = 0; g < per_epoch_; ++g) {
        const std::vector<int64_t> s = serial.row_samples(g);
        if (std::find(s.begin(), s.end(), 5) != s.end() || std::find(s.begin(), s.end(), 17) != s.end()) continue;
        MultimodalBatch want;
        serial.fill(g, 1, &want);
        for (const int threads : kThreadCounts) {
            const ImageTextRows parallel(dataset, ByteTokenizer(), rows_options(threads));
            MultimodalBatch got;
            parallel.fill(g, 1, &got);
            expect_bitwise(want, got, fmt::format("row {}, {} threads", g, threads));
        }
        ++good;
    }
    EXPECT_GT(good, 2);
}

TEST_P(ImageTextRowsParallel, ErrorIsTheFirstBadSampleInRowOrder) {
    const Outcome serial = fill_fresh(GetParam(), paths_, false, 1, rows_);
    ASSERT_NE(serial.error, "");
    EXPECT_NE(serial.error.find(first_bad_where_), std::string::npos) << serial.error;
    EXPECT_NE(serial.error.find(first_bad_ == 5 ? "corrupt PNG" : "corrupt JPEG"), std::string::npos) << serial.error;
    EXPECT_EQ(serial.skipped, 0);
    for (int repeat = 0; repeat < 3; ++repeat)
        for (const int threads : kThreadCounts) {
            const Outcome parallel = fill_fresh(GetParam(), paths_, false, threads, rows_);
            EXPECT_EQ(parallel.error, serial.error) << threads << " threads";
            EXPECT_EQ(parallel.skipped, 0);
        }
}

TEST_P(ImageTextRowsParallel, LoaderThreadGivesTheSerialBatchesAndError) {
    // The fill's threads started from the loader's background thread, as in training.
    const ImageTextDataset dataset(GetParam(), paths_, quiet());
    const ImageTextRows serial(dataset, ByteTokenizer(), rows_options(1));
    const ImageTextRows parallel(dataset, ByteTokenizer(), rows_options(4));
    ImageTextLoader loader([&](int64_t f, int64_t n, MultimodalBatch* out) { parallel.fill(f, n, out); }, 2);
    MultimodalBatch got;  // reused, as the trainer does: its buffers go back to the worker
    for (int64_t g = 0; g + 2 <= rows_; g += 2) {
        MultimodalBatch want;
        std::string got_error, want_error;
        try {
            loader.get(g, 2, &got);
        } catch (const core::Error& e) {
            got_error = e.what();
        }
        try {
            serial.fill(g, 2, &want);
        } catch (const core::Error& e) {
            want_error = e.what();
        }
        EXPECT_EQ(got_error, want_error) << "rows " << g;
        if (want_error.empty()) expect_bitwise(want, got, fmt::format("rows {} + 2", g));
    }
    EXPECT_GT(loader.served_prefetched(), 0);
}

INSTANTIATE_TEST_SUITE_P(Formats,
                         ImageTextRowsParallel,
                         ::testing::Values("webdataset", "image_jsonl"),
                         [](const auto& info) { return info.param; });

TEST(ImageTextRows, LoaderThreadsZeroPicksHalfTheHardwareThreadsUpToEight) {
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    EXPECT_EQ(image_text_fill_threads(0), std::clamp(hardware / 2, 1, 8));
    EXPECT_EQ(image_text_fill_threads(1), 1);
    EXPECT_EQ(image_text_fill_threads(12), 12);
    EXPECT_THROW(image_text_fill_threads(-1), core::Error);
}

}  // namespace
}  // namespace mt::data
