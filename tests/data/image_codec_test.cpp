// The image codec (data/image_codec.h): PNG round trips bit for bit, JPEG within a small error, grey, alpha, palette
// and 16-bit PNGs come back as 8-bit RGB, the header probe gives the size without decoding, and damaged bytes (not an
// image, truncated, a flipped byte in the pixel data) are input-data errors.
#include "data/image_codec.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;

std::vector<uint8_t> noise_rgb(int h, int w, uint64_t seed) {
    std::vector<uint8_t> rgb(static_cast<size_t>(h * w * 3));
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(core::rng_u64(seed, 7, i) & 255);
    return rgb;
}

// A PNG of any simplified-API format (grey, grey+alpha, RGBA, palette, 16-bit linear), written by libpng itself.
std::vector<uint8_t> png_of(
    png_uint_32 format, int h, int w, const void* pixels, const void* colormap = nullptr, int colors = 0) {
    png_image image;
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    image.width = static_cast<png_uint_32>(w);
    image.height = static_cast<png_uint_32>(h);
    image.format = format;
    image.colormap_entries = static_cast<png_uint_32>(colors);
    png_alloc_size_t bytes = 0;
    EXPECT_NE(png_image_write_to_memory(&image, nullptr, &bytes, 0, pixels, 0, colormap), 0) << image.message;
    std::vector<uint8_t> out(bytes);
    EXPECT_NE(png_image_write_to_memory(&image, out.data(), &bytes, 0, pixels, 0, colormap), 0) << image.message;
    out.resize(bytes);
    return out;
}

TEST(ImageCodec, PngRoundTripIsBitwise) {
    for (auto [h, w] : {std::pair{1, 1}, {13, 7}, {28, 56}}) {
        const std::vector<uint8_t> rgb = noise_rgb(h, w, 1);
        const std::vector<uint8_t> png = image_encode_png(rgb, h, w);
        EXPECT_EQ(image_format_of(png), ImageFormat::png);
        EXPECT_EQ(image_probe_size(png), (ImageSize{h, w}));
        const DecodedImage back = image_decode(png);
        EXPECT_EQ(back.height, h);
        EXPECT_EQ(back.width, w);
        EXPECT_EQ(back.rgb, rgb);
    }
}

TEST(ImageCodec, JpegRoundTripIsClose) {
    const int h = 40, w = 56;
    std::vector<uint8_t> rgb(static_cast<size_t>(h * w * 3));
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c) rgb[(y * w + x) * 3 + c] = static_cast<uint8_t>(40 + 3 * y + 2 * x + 20 * c);
    const std::vector<uint8_t> jpeg = image_encode_jpeg(rgb, h, w, 95);
    EXPECT_EQ(image_format_of(jpeg), ImageFormat::jpeg);
    EXPECT_EQ(image_probe_size(jpeg), (ImageSize{h, w}));
    const DecodedImage back = image_decode(jpeg);
    ASSERT_EQ(back.rgb.size(), rgb.size());
    double err = 0.0;
    for (size_t i = 0; i < rgb.size(); ++i) err += std::abs(int{back.rgb[i]} - int{rgb[i]});
    EXPECT_LT(err / static_cast<double>(rgb.size()), 4.0);  // a smooth image at quality 95, chroma subsampled
}

TEST(ImageCodec, PngGreyAlphaPaletteAnd16BitBecome8BitRgb) {
    const uint8_t grey[4] = {0, 85, 170, 255};
    DecodedImage d = image_decode(png_of(PNG_FORMAT_GRAY, 2, 2, grey));
    EXPECT_EQ(d.rgb, (std::vector<uint8_t>{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));

    const uint8_t rgba[8] = {10, 20, 30, 0, 40, 50, 60, 255};  // alpha dropped, colours as stored
    d = image_decode(png_of(PNG_FORMAT_RGBA, 1, 2, rgba));
    EXPECT_EQ(d.rgb, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));

    const uint8_t ga[4] = {7, 100, 9, 255};
    d = image_decode(png_of(PNG_FORMAT_GA, 1, 2, ga));
    EXPECT_EQ(d.rgb, (std::vector<uint8_t>{7, 7, 7, 9, 9, 9}));

    const uint8_t palette[6] = {255, 0, 0, 0, 0, 255};
    const uint8_t index[3] = {1, 0, 1};
    d = image_decode(png_of(PNG_FORMAT_RGB_COLORMAP, 1, 3, index, palette, 2));
    EXPECT_EQ(d.rgb, (std::vector<uint8_t>{0, 0, 255, 255, 0, 0, 0, 0, 255}));

    const uint16_t deep[2] = {257 * 3, 257 * 200};  // 16-bit samples scale to 8 bits exactly at multiples of 257
    d = image_decode(png_of(PNG_FORMAT_LINEAR_Y, 1, 2, deep));
    EXPECT_EQ(d.rgb, (std::vector<uint8_t>{3, 3, 3, 200, 200, 200}));
}

TEST(ImageCodec, DamagedBytesAreDataErrors) {
    const std::vector<uint8_t> rgb = noise_rgb(16, 16, 2);
    const std::vector<uint8_t> png = image_encode_png(rgb, 16, 16);
    const std::vector<uint8_t> jpeg = image_encode_jpeg(rgb, 16, 16);
    const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
    expect_error([&] { image_decode(text); }, ExitCode::data, {"not a PNG or JPEG image", "68 65 6c 6c"});
    expect_error([&] { image_probe_size(std::vector<uint8_t>{}); }, ExitCode::data, {"empty"});
    const std::vector<uint8_t> png_cut(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
    expect_error([&] { image_decode(png_cut); }, ExitCode::data, {"corrupt PNG", "truncated"});
    EXPECT_EQ(image_probe_size(png_cut), (ImageSize{16, 16}));  // the header alone still reads
    const std::vector<uint8_t> jpeg_cut(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
    expect_error([&] { image_decode(jpeg_cut); }, ExitCode::data, {"corrupt JPEG", "Premature end"});
    std::vector<uint8_t> png_flip = png;
    png_flip[png.size() - 20] ^= 0x40;  // inside the pixel data: its CRC no longer matches
    expect_error([&] { image_decode(png_flip); }, ExitCode::data, {"corrupt PNG"});
    const std::vector<uint8_t> png_head(png.begin(), png.begin() + 12);
    expect_error([&] { image_probe_size(png_head); }, ExitCode::data, {"damaged PNG header"});
}

TEST(ImageCodec, FormatFromNameAndBytes) {
    EXPECT_EQ(image_format_of_name("a/b.PNG"), ImageFormat::png);
    EXPECT_EQ(image_format_of_name("x.jpg"), ImageFormat::jpeg);
    EXPECT_EQ(image_format_of_name("x.JPEG"), ImageFormat::jpeg);
    EXPECT_EQ(image_format_of_name("x.txt"), ImageFormat::unknown);
    EXPECT_EQ(image_format_of_name("noext"), ImageFormat::unknown);
}

}  // namespace
}  // namespace mt::data
