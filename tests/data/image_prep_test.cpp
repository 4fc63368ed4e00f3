// Image preparation (multimodal.md §1): fit sizes inside [min_pixels, max_pixels] (in range, scaled down, scaled up,
// rounding stepped back into range, extreme aspect ratios, impossible ranges), bilinear resize against hand-computed
// values and identity, and the patch order checked element by element on an image whose pixels encode (y, x).
#include "data/image_prep.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/shapes.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;

constexpr int64_t kMin = 112 * 112;  // vision.min_pixels
constexpr int64_t kMax = 448 * 448;  // vision.max_pixels

ImageSize fit(int h, int w) {
    return image_fit_size(h, w, kMin, kMax);
}

TEST(ImagePrepFit, SizesAlreadyValidStay) {
    EXPECT_EQ(fit(112, 112), (ImageSize{112, 112}));
    EXPECT_EQ(fit(448, 448), (ImageSize{448, 448}));
    for (int h : kShapesCanvasSizes)
        for (int w : kShapesCanvasSizes) EXPECT_EQ(fit(h, w), (ImageSize{h, w})) << h << "x" << w;
}

TEST(ImagePrepFit, InRangeRoundsEachSideToTheNearestMultiple) {
    EXPECT_EQ(fit(125, 300), (ImageSize{112, 308}));  // 4.46 -> 4, 10.71 -> 11 units
    EXPECT_EQ(fit(126, 126), (ImageSize{140, 140}));  // 4.5 rounds up
}

TEST(ImagePrepFit, LargeImagesScaleDownToMaxPixels) {
    // s = sqrt(448^2 / 500000): ideal 22.63 x 11.31 units -> 23 x 11 = 253 <= 256.
    EXPECT_EQ(fit(1000, 500), (ImageSize{644, 308}));
    // ideal 18.48 x 13.86 -> 18 x 14 = 252.
    EXPECT_EQ(fit(4000, 3000), (ImageSize{504, 392}));
    // ideal 12.60 x 20.32 rounds to 13 x 20 = 260 > 256; 12 x 20 keeps 0.62 better than 13 x 19.
    EXPECT_EQ(fit(620, 1000), (ImageSize{336, 560}));
}

TEST(ImagePrepFit, SmallImagesScaleUpToMinPixels) {
    EXPECT_EQ(fit(10, 10), (ImageSize{112, 112}));
    EXPECT_EQ(fit(1, 1), (ImageSize{112, 112}));
    // ideal 3.45 x 4.64 rounds to 3 x 5 = 15 < 16; 4 x 5 keeps 0.744 better than 3 x 6.
    EXPECT_EQ(fit(93, 125), (ImageSize{112, 140}));
    // ideal 2.15 x 7.43 rounds to 2 x 7 = 14; 2 x 8 keeps 0.29 better than 3 x 7.
    EXPECT_EQ(fit(29, 100), (ImageSize{56, 224}));
    EXPECT_EQ(fit(100, 29), (ImageSize{224, 56}));
}

TEST(ImagePrepFit, ExtremeAspectRatiosEndAsOneUnitStrips) {
    EXPECT_EQ(fit(10000, 10), (ImageSize{7168, 28}));
    EXPECT_EQ(fit(10, 10000), (ImageSize{28, 7168}));
    // Scaled up to min_pixels: ideal 0.057 x 282.8 units -> 1 x 283, then the width steps down to 256.
    EXPECT_EQ(fit(1, 5000), (ImageSize{28, 7168}));
    EXPECT_EQ(fit(1, 100), (ImageSize{28, 1120}));  // ideal 0.4 x 40: the height is clamped to one unit
}

TEST(ImagePrepFit, EverySizeLandsInRange) {
    const int sides[] = {1, 7, 27, 28, 29, 100, 111, 333, 449, 1000, 1023, 4000, 12345};
    for (int h : sides)
        for (int w : sides) {
            const ImageSize s = fit(h, w);
            EXPECT_EQ(s.height % 28, 0) << h << "x" << w;
            EXPECT_EQ(s.width % 28, 0) << h << "x" << w;
            const int64_t area = int64_t{s.height} * s.width;
            EXPECT_GE(area, kMin) << h << "x" << w;
            EXPECT_LE(area, kMax) << h << "x" << w;
            if (h >= 28 && w >= 28 && h <= 4 * w && w <= 4 * h) {
                // Moderate aspect ratios are kept to within one unit of rounding on each side.
                const double aspect = double(h) / w, got = double(s.height) / s.width;
                EXPECT_LT(std::abs(std::log(got / aspect)), 0.3) << h << "x" << w;
            }
        }
    EXPECT_EQ(image_fit_size(1000, 1000, 28 * 28, 28 * 28), (ImageSize{28, 28}));
    EXPECT_EQ(image_fit_size(50, 50, 1, 1000000, 14), (ImageSize{56, 56}));
}

TEST(ImagePrepFit, ImpossibleRangesFailNamingThem) {
    expect_error([] { image_fit_size(100, 100, 1000, 700); }, ExitCode::internal, {"min_pixels 1000", "700"});
    expect_error([] { image_fit_size(100, 100, 800, 1500); }, ExitCode::internal, {"multiples of 28"});
    // Exactly 7 units (a prime): only 1 x 7 fits, which a square image cannot reach one unit at a time.
    expect_error([] { image_fit_size(100, 100, 7 * 784, 7 * 784); }, ExitCode::internal, {"widen"});
    expect_error([] { image_fit_size(0, 100, kMin, kMax); }, ExitCode::internal, {"positive"});
}

TEST(ImagePrepResize, TwoByTwoToFourByFourByHand) {
    // Channel 0 is [[0, 100], [200, 40]], channel 1 its complement 255 - x, channel 2 constant 7. Half-pixel centres
    // give per axis the taps (1, 0), (.75, .25), (.25, .75), (0, 1).
    const std::vector<uint8_t> src = {0, 255, 7, 100, 155, 7, 200, 55, 7, 40, 215, 7};
    const std::vector<int> want0 = {
        0,
        25,
        75,
        100,  // row 0 = source row 0
        50,
        59,
        76,
        85,  // .75 row 0 + .25 row 3: 58.75 -> 59, 76.25 -> 76
        150,
        126,
        79,
        55,  // .25 row 0 + .75 row 3: 126.25 -> 126, 78.75 -> 79
        200,
        160,
        80,
        40,  // row 3 = source row 1
    };
    const auto out = image_resize_bilinear(src.data(), 2, 2, 4, 4);
    ASSERT_EQ(out.size(), 48u);
    for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(out[i * 3 + 0], want0[i]) << "pixel " << i;
        EXPECT_EQ(out[i * 3 + 1], 255 - want0[i]) << "pixel " << i;
        EXPECT_EQ(out[i * 3 + 2], 7) << "pixel " << i;
    }
}

TEST(ImagePrepResize, HalvingAveragesTwoByTwoBlocksRoundingHalfUp) {
    // 4 -> 2 samples source coordinate 0.5 and 2.5: the mean of each 2x2 block.
    std::vector<uint8_t> src(4 * 4 * 3, 0);
    const int block[4][4] = {{1, 2, 0, 0}, {3, 4, 0, 1}, {9, 9, 255, 255}, {9, 9, 255, 254}};
    for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 4; ++x) src[(y * 4 + x) * 3] = static_cast<uint8_t>(block[y][x]);
    const auto out = image_resize_bilinear(src.data(), 4, 4, 2, 2);
    EXPECT_EQ(out[0], 3);    // 2.5 rounds up
    EXPECT_EQ(out[3], 0);    // 0.25
    EXPECT_EQ(out[6], 9);    // 9
    EXPECT_EQ(out[9], 255);  // 254.75
}

TEST(ImagePrepResize, UnchangedSizeIsTheIdentity) {
    const ShapesImage img = shapes_render(ShapesDataset(ShapesOptions{}).sample(ShapesSplit::train, 3).scene, 61, 47);
    EXPECT_EQ(image_resize_bilinear(img.rgb.data(), 61, 47, 61, 47), img.rgb);
}

TEST(ImagePrepResize, OneAxisAtATime) {
    // A horizontal ramp resized in height only keeps every row equal to the source row.
    std::vector<uint8_t> src(3 * 5 * 3);
    for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 5; ++x)
            for (int c = 0; c < 3; ++c) src[(y * 5 + x) * 3 + c] = static_cast<uint8_t>(40 * x + c);
    const auto out = image_resize_bilinear(src.data(), 3, 5, 7, 5);
    for (int y = 0; y < 7; ++y)
        for (int i = 0; i < 15; ++i) EXPECT_EQ(out[y * 15 + i], src[i]) << y << " " << i;
}

// Pixel (y, x) holds (y, x, 255 - y), so every output value names the pixel it came from.
std::vector<uint8_t> coordinate_image(int h, int w) {
    std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
            p[0] = static_cast<uint8_t>(y);
            p[1] = static_cast<uint8_t>(x);
            p[2] = static_cast<uint8_t>(255 - y);
        }
    return rgb;
}

void expect_patch_order(const ImagePatchOptions& o) {
    const int h = 56, w = 84, p = 14, gw = w / p;
    const auto rgb = coordinate_image(h, w);
    const int64_t values = image_patch_values(p);
    ASSERT_EQ(values, 588);
    std::vector<float> out(static_cast<size_t>((h / p) * gw * values), -99.0f);
    image_patchify(rgb.data(), h, w, o, out.data());
    for (size_t f = 0; f < out.size(); ++f) {
        // Decode the flat index as (patch, row, column, channel) in raster / (row, column, channel) order.
        const int patch = static_cast<int>(f / values), within = static_cast<int>(f % values);
        const int r = within / (p * 3), col = (within / 3) % p, c = within % 3;
        const int y = (patch / gw) * p + r, x = (patch % gw) * p + col;
        const int v = c == 0 ? y : c == 1 ? x : 255 - y;
        const float want = (static_cast<float>(v) / 255.0f - o.mean[c]) / o.std[c];
        ASSERT_EQ(out[f], want) << "value " << f << ": patch " << patch << " row " << r << " col " << col << " ch "
                                << c;
    }
}

TEST(ImagePrepPatchify, RasterPatchesInRowColumnChannelOrder) {
    expect_patch_order(ImagePatchOptions{});
    expect_patch_order(ImagePatchOptions{14, {0.48f, 0.46f, 0.41f}, {0.27f, 0.26f, 0.28f}});
}

TEST(ImagePrepPatchify, DefaultNormalisationSpansMinusOneToOne) {
    const std::vector<uint8_t> rgb(28 * 28 * 3, 255);
    std::vector<float> out(4 * 588);
    image_patchify(rgb.data(), 28, 28, ImagePatchOptions{}, out.data());
    for (float v : out) ASSERT_EQ(v, 1.0f);
    const std::vector<uint8_t> black(28 * 28 * 3, 0);
    image_patchify(black.data(), 28, 28, ImagePatchOptions{}, out.data());
    for (float v : out) ASSERT_EQ(v, -1.0f);
}

TEST(ImagePrepPatchify, OddGridsFail) {
    std::vector<uint8_t> rgb(28 * 42 * 3);
    std::vector<float> out(6 * 588);
    expect_error([&] { image_patchify(rgb.data(), 28, 42, ImagePatchOptions{}, out.data()); },
                 ExitCode::internal,
                 {"28x42", "multiples of 28"});
}

}  // namespace
}  // namespace mt::data
