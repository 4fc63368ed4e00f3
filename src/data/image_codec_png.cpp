// PNG decoding and encoding with libpng (image_codec.h). libpng reports errors by longjmp to the setjmp of the call;
// every C++ object those functions own is constructed before their setjmp, so the jump never skips a destructor.
#include <png.h>

#include <csetjmp>
#include <cstring>

#include "core/error.h"
#include "data/image_codec.h"

namespace mt::data {

namespace {

// Where libpng reads from and what it said when it failed.
struct PngSource {
    std::span<const uint8_t> bytes;
    size_t at = 0;
    char message[256] = {};
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
    auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
    if (n > src->bytes.size() - src->at) png_error(png, "the file ends inside the image (truncated)");
    std::memcpy(out, src->bytes.data() + src->at, n);
    src->at += n;
}

void png_on_error(png_structp png, png_const_charp message) {
    auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
    std::snprintf(src->message, sizeof(src->message), "%s", message);
    png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // benign (an unknown chunk, a bad gAMA): the pixels are fine

}  // namespace

// Reads the header, or header and pixels when rgb is not null; fills size. Returns false with src->message set.
static bool png_read(PngSource* src, ImageSize* size, std::vector<uint8_t>* rgb) {
    std::vector<png_bytep> rows;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, png_on_error, png_on_warning);
    if (png == nullptr) {
        std::snprintf(src->message, sizeof(src->message), "libpng could not start");
        return false;
    }
    png_infop info = png_create_info_struct(png);
    if (info == nullptr || setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        return false;
    }
    png_set_read_fn(png, src, png_read_bytes);
    png_set_user_limits(png, 1 << 20, 1 << 20);
    png_read_info(png, info);
    size->width = static_cast<int>(png_get_image_width(png, info));
    size->height = static_cast<int>(png_get_image_height(png, info));
    if (rgb != nullptr) {
        if (int64_t{size->height} * size->width > kImageMaxPixels)
            png_error(png, "the image is larger than 2^26 pixels");
        const int color = png_get_color_type(png, info);
        png_set_expand(png);  // palette to RGB, grey below 8 bits to 8, tRNS to an alpha channel
        png_set_scale_16(png);
        if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
        png_set_strip_alpha(png);
        png_set_interlace_handling(png);
        png_read_update_info(png, info);
        if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8)
            png_error(png, "libpng did not convert the image to 8-bit RGB");
        rgb->resize(static_cast<size_t>(size->height) * static_cast<size_t>(size->width) * 3);
        rows.resize(static_cast<size_t>(size->height));
        for (size_t y = 0; y < rows.size(); ++y) rows[y] = rgb->data() + y * static_cast<size_t>(size->width) * 3;
        png_read_image(png, rows.data());
    }
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
}

ImageSize image_probe_png(std::span<const uint8_t> bytes) {
    PngSource src{.bytes = bytes};
    ImageSize size;
    if (!png_read(&src, &size, nullptr)) core::fail(core::ExitCode::data, "damaged PNG header: {}", src.message);
    return size;
}

DecodedImage image_decode_png(std::span<const uint8_t> bytes) {
    PngSource src{.bytes = bytes};
    DecodedImage out;
    ImageSize size;
    if (!png_read(&src, &size, &out.rgb)) core::fail(core::ExitCode::data, "corrupt PNG: {}", src.message);
    out.height = size.height;
    out.width = size.width;
    return out;
}

std::vector<uint8_t> image_encode_png(std::span<const uint8_t> rgb, int height, int width) {
    MT_CHECK(height >= 1 && width >= 1 && std::ssize(rgb) == int64_t{height} * width * 3,
             "PNG encode of {}x{} from {} bytes",
             height,
             width,
             rgb.size());
    png_image image;
    std::memset(&image, 0, sizeof(image));
    image.version = PNG_IMAGE_VERSION;
    image.width = static_cast<png_uint_32>(width);
    image.height = static_cast<png_uint_32>(height);
    image.format = PNG_FORMAT_RGB;
    png_alloc_size_t bytes = 0;
    MT_CHECK(png_image_write_to_memory(&image, nullptr, &bytes, 0, rgb.data(), 0, nullptr) != 0,
             "PNG size query failed: {}",
             image.message);
    std::vector<uint8_t> out(bytes);
    MT_CHECK(png_image_write_to_memory(&image, out.data(), &bytes, 0, rgb.data(), 0, nullptr) != 0,
             "PNG encode failed: {}",
             image.message);
    out.resize(bytes);
    return out;
}

}  // namespace mt::data
