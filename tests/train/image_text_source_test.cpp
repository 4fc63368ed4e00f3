// The shapes rows of ImageTextSource (train/image_text_source.h): rendered in parallel over rows, the fill is the same
// bytes for any thread count and any split of the rows into fills (each row a function of its index alone).
#include "train/image_text_source.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

namespace mt::train {
namespace {

struct Fill {
    std::vector<int32_t> inputs, targets;
    std::vector<float> patches;
    std::vector<nn::ImageGrid> grids;
    double blind = 0.0;
};

Fill fill_rows(ImageTextSource& source, int64_t first_row, int64_t rows, int64_t seq) {
    const core::Tensor inputs = core::Tensor::zeros({rows, seq}, core::DType::i32), targets = inputs.clone();
    nn::VisionBatch images;
    ImageTextStats stats;
    source.fill(first_row, rows, inputs, targets, &images, &stats);
    Fill f;
    f.inputs.assign(inputs.data<int32_t>(), inputs.data<int32_t>() + inputs.numel());
    f.targets.assign(targets.data<int32_t>(), targets.data<int32_t>() + targets.numel());
    f.patches.assign(images.patches.data<float>(), images.patches.data<float>() + images.patches.numel());
    f.grids = images.grids;
    f.blind = stats.blind_nats;
    return f;
}

void expect_same(const Fill& a, const Fill& b) {
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.targets, b.targets);
    ASSERT_EQ(a.patches.size(), b.patches.size());
    EXPECT_EQ(std::memcmp(a.patches.data(), b.patches.data(), a.patches.size() * sizeof(float)), 0);
    ASSERT_EQ(a.grids.size(), b.grids.size());
    for (size_t i = 0; i < a.grids.size(); ++i) {
        EXPECT_EQ(a.grids[i].h, b.grids[i].h);
        EXPECT_EQ(a.grids[i].w, b.grids[i].w);
    }
    EXPECT_EQ(a.blind, b.blind);
}

TEST(ImageTextSource, ParallelFillIsTheSerialFillBitwise) {
    data::ShapesOptions options;
    options.seed = 7;
    options.stage = 4;
    options.max_canvas = 168;
    const int64_t seq = 192, rows = 6;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    ImageTextSource serial(options, data::ShapesSplit::train, seq, 14);
    const Fill one = fill_rows(serial, 3, rows, seq);
    omp_set_num_threads(4);
    ImageTextSource parallel(options, data::ShapesSplit::train, seq, 14);
    const Fill four = fill_rows(parallel, 3, rows, seq);
    omp_set_num_threads(saved);
    ASSERT_FALSE(one.grids.empty());
    expect_same(one, four);
    // The same rows in two fills of three: row g depends on g alone.
    const Fill head = fill_rows(parallel, 3, 3, seq), tail = fill_rows(parallel, 6, 3, seq);
    Fill joined = head;
    joined.inputs.insert(joined.inputs.end(), tail.inputs.begin(), tail.inputs.end());
    joined.targets.insert(joined.targets.end(), tail.targets.begin(), tail.targets.end());
    joined.patches.insert(joined.patches.end(), tail.patches.begin(), tail.patches.end());
    joined.grids.insert(joined.grids.end(), tail.grids.begin(), tail.grids.end());
    joined.blind += tail.blind;
    EXPECT_EQ(joined.inputs, one.inputs);
    EXPECT_EQ(joined.patches.size(), one.patches.size());
    EXPECT_EQ(joined.grids.size(), one.grids.size());
    EXPECT_NEAR(joined.blind, one.blind, 1e-9 * one.blind);
}

}  // namespace
}  // namespace mt::train
