// Format detection and the format-independent checks of the image codec (image_codec.h).
#include "data/image_codec.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"

namespace mt::data {

ImageFormat image_format_of(std::span<const uint8_t> bytes) {
    static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::png;
    if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return ImageFormat::jpeg;
    return ImageFormat::unknown;
}

const char* image_format_name(ImageFormat format) {
    switch (format) {
        case ImageFormat::png:
            return "png";
        case ImageFormat::jpeg:
            return "jpeg";
        case ImageFormat::unknown:
            break;
    }
    return "unknown";
}

ImageFormat image_format_of_name(const std::string& name) {
    const size_t dot = name.rfind('.');
    if (dot == std::string::npos) return ImageFormat::unknown;
    std::string ext = name.substr(dot + 1);
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (ext == "png") return ImageFormat::png;
    if (ext == "jpg" || ext == "jpeg") return ImageFormat::jpeg;
    return ImageFormat::unknown;
}

namespace {

[[noreturn]] void fail_not_an_image(std::span<const uint8_t> bytes) {
    if (bytes.empty()) core::fail(core::ExitCode::data, "the image is empty (0 bytes)");
    core::fail(core::ExitCode::data,
               "not a PNG or JPEG image (the first bytes are {:02x})",
               fmt::join(bytes.first(std::min<size_t>(bytes.size(), 4)), " "));
}

}  // namespace

ImageSize image_probe_size(std::span<const uint8_t> bytes) {
    const ImageFormat format = image_format_of(bytes);
    if (format == ImageFormat::unknown) fail_not_an_image(bytes);
    const ImageSize size = format == ImageFormat::png ? image_probe_png(bytes) : image_probe_jpeg(bytes);
    if (size.height < 1 || size.width < 1)
        core::fail(core::ExitCode::data,
                   "the {} header says {}x{} pixels",
                   image_format_name(format),
                   size.height,
                   size.width);
    if (int64_t{size.height} * size.width > kImageMaxPixels)
        core::fail(core::ExitCode::data,
                   "the {} image is {}x{} pixels, more than the 2^26 moetrain decodes",
                   image_format_name(format),
                   size.height,
                   size.width);
    return size;
}

DecodedImage image_decode(std::span<const uint8_t> bytes) {
    const ImageFormat format = image_format_of(bytes);
    if (format == ImageFormat::unknown) fail_not_an_image(bytes);
    return format == ImageFormat::png ? image_decode_png(bytes) : image_decode_jpeg(bytes);
}

}  // namespace mt::data
