// JPEG and PNG in memory, for the image-text data on disk (docs/data.md "Image-text data"): decoding to 8-bit RGB
// with libjpeg-turbo and libpng (Debian's libjpeg62-turbo-dev and libpng-dev), a header-only size probe so a dataset
// can be indexed without decoding it, and encoders for `moetrain data --images`. Damaged bytes are an input-data error
// (exit 3); the caller adds where the bytes came from (the shard and the sample key).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/image_prep.h"

namespace mt::data {

enum class ImageFormat { unknown, png, jpeg };

// An 8-bit RGB image, [height, width, 3] row-major.
struct DecodedImage {
    int height = 0;
    int width = 0;
    std::vector<uint8_t> rgb;
};

// The format from the first bytes (the PNG signature, the JPEG SOI marker FF D8 FF); unknown for anything else.
// @param[in] bytes  the file's bytes (at least the first 8 to tell)
ImageFormat image_format_of(std::span<const uint8_t> bytes);

// "png", "jpeg" or "unknown".
const char* image_format_name(ImageFormat format);

// The format a file name's extension promises (.png; .jpg, .jpeg; any case); unknown for others.
// @param[in] name  a file or tar member name
ImageFormat image_format_of_name(const std::string& name);

// The size stored in the header, read without decoding the pixels: PNG's IHDR, or JPEG's frame header (libjpeg's
// jpeg_read_header). `bytes` may be a prefix of the file as long as it holds the header. Throws Error(ExitCode::data)
// with a message saying what is wrong (not a PNG or JPEG, a damaged or missing header, a zero or over-large size);
// the caller appends where the bytes came from.
// @param[in] bytes  the file's bytes, or a prefix of them
ImageSize image_probe_size(std::span<const uint8_t> bytes);

// Decodes a whole PNG or JPEG to 8-bit RGB:
//   * PNG: palette and grey expanded to RGB, 16-bit samples scaled to 8 (png_set_scale_16, rounded), an alpha
//     channel or tRNS transparency dropped (the colour as stored, like PIL's convert("RGB")), interlacing undone; no
//     gamma or ICC conversion.
//   * JPEG: grey and YCbCr converted to RGB by libjpeg; CMYK and YCCK (Adobe, stored inverted) converted with
//     R = C K / 255 on the inverted values.
// Throws Error(ExitCode::data) for bytes of another format, a damaged stream, a truncated file (libjpeg's "premature
// end of data" warning counts as an error: the rest of such an image would be grey), or a size above 2^26 pixels.
// @param[in] bytes  the whole file
DecodedImage image_decode(std::span<const uint8_t> bytes);

// Encodes 8-bit RGB as PNG (8-bit RGB, no interlace, no gamma chunks), which image_decode returns bit for bit.
// @param[in] rgb            [height, width, 3]
// @param[in] height, width  >= 1
std::vector<uint8_t> image_encode_png(std::span<const uint8_t> rgb, int height, int width);

// Encodes 8-bit RGB as baseline JPEG (4:2:0 chroma subsampling) of the given quality, 1..100.
// @param[in] rgb            [height, width, 3]
// @param[in] height, width  >= 1
// @param[in] quality        libjpeg quality, 1..100
std::vector<uint8_t> image_encode_jpeg(std::span<const uint8_t> rgb, int height, int width, int quality = 95);

// The per-format halves of image_probe_size and image_decode (image_codec_png.cpp, image_codec_jpeg.cpp), which
// check the format's own structure only.
ImageSize image_probe_png(std::span<const uint8_t> bytes);
ImageSize image_probe_jpeg(std::span<const uint8_t> bytes);
DecodedImage image_decode_png(std::span<const uint8_t> bytes);
DecodedImage image_decode_jpeg(std::span<const uint8_t> bytes);

// The largest image decoded: 2^26 pixels (8192 x 8192), 192 MiB of RGB, so a forged header cannot exhaust memory.
inline constexpr int64_t kImageMaxPixels = int64_t{1} << 26;

}  // namespace mt::data
