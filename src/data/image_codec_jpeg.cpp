// JPEG decoding and encoding with libjpeg-turbo's libjpeg API (image_codec.h). libjpeg reports errors through
// error_exit, which longjmps back to the setjmp of the call; every C++ object those functions own is constructed before
// their setjmp, so the jump never skips a destructor.
// jpeglib.h needs size_t and FILE declared before it, so <cstdio> comes first.
// clang-format off
#include <cstdio>
#include <jerror.h>
#include <jpeglib.h>
// clang-format on

#include <csetjmp>
#include <cstring>

#include "core/error.h"
#include "data/image_codec.h"

namespace mt::data {

namespace {

struct JpegErrors {
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX] = {};
};

void jpeg_on_error(j_common_ptr cinfo) {
    auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, e->message);
    std::longjmp(e->jump, 1);
}

// Warnings are corrupt-data notes; "premature end of file" means the rest of the image would be filled with grey, so
// it is an error here (a truncated image is damaged data, not an image).
void jpeg_on_message(j_common_ptr cinfo, int level) {
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) cinfo->err->error_exit(cinfo);
}

JpegErrors* jpeg_errors_init(JpegErrors* e, jpeg_decompress_struct* cinfo) {
    cinfo->err = jpeg_std_error(&e->mgr);
    e->mgr.error_exit = jpeg_on_error;
    e->mgr.emit_message = jpeg_on_message;
    return e;
}

// Reads the header, or header and pixels when rgb is not null. Returns false with e->message set.
bool jpeg_read(std::span<const uint8_t> bytes, JpegErrors* e, ImageSize* size, std::vector<uint8_t>* rgb) {
    std::vector<uint8_t> cmyk_row;
    jpeg_decompress_struct cinfo;
    std::memset(&cinfo, 0, sizeof(cinfo));
    jpeg_errors_init(e, &cinfo);
    if (setjmp(e->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return false;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
    jpeg_read_header(&cinfo, TRUE);
    size->height = static_cast<int>(cinfo.image_height);
    size->width = static_cast<int>(cinfo.image_width);
    if (rgb != nullptr) {
        if (int64_t{size->height} * size->width > kImageMaxPixels) {
            std::snprintf(e->message, sizeof(e->message), "the image is larger than 2^26 pixels");
            jpeg_destroy_decompress(&cinfo);
            return false;
        }
        const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
        cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
        jpeg_start_decompress(&cinfo);
        const size_t w = cinfo.output_width;
        rgb->resize(static_cast<size_t>(cinfo.output_height) * w * 3);
        cmyk_row.resize(cmyk ? w * 4 : 0);
        while (cinfo.output_scanline < cinfo.output_height) {
            uint8_t* out = rgb->data() + static_cast<size_t>(cinfo.output_scanline) * w * 3;
            JSAMPROW row = cmyk ? cmyk_row.data() : out;
            jpeg_read_scanlines(&cinfo, &row, 1);
            // Adobe's CMYK JPEGs store inverted values, so 255 - C is the cyan-free share: R = (255 - C)(255 - K).
            for (size_t x = 0; cmyk && x < w; ++x)
                for (size_t c = 0; c < 3; ++c)
                    out[x * 3 + c] = static_cast<uint8_t>((cmyk_row[x * 4 + c] * cmyk_row[x * 4 + 3] + 127) / 255);
        }
        jpeg_finish_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
    return true;
}

}  // namespace

ImageSize image_probe_jpeg(std::span<const uint8_t> bytes) {
    JpegErrors e;
    ImageSize size;
    if (!jpeg_read(bytes, &e, &size, nullptr)) core::fail(core::ExitCode::data, "damaged JPEG header: {}", e.message);
    return size;
}

DecodedImage image_decode_jpeg(std::span<const uint8_t> bytes) {
    JpegErrors e;
    DecodedImage out;
    ImageSize size;
    if (!jpeg_read(bytes, &e, &size, &out.rgb)) core::fail(core::ExitCode::data, "corrupt JPEG: {}", e.message);
    out.height = size.height;
    out.width = size.width;
    return out;
}

std::vector<uint8_t> image_encode_jpeg(std::span<const uint8_t> rgb, int height, int width, int quality) {
    MT_CHECK(height >= 1 && width >= 1 && std::ssize(rgb) == int64_t{height} * width * 3,
             "JPEG encode of {}x{} from {} bytes",
             height,
             width,
             rgb.size());
    MT_CHECK(quality >= 1 && quality <= 100, "JPEG quality {} must be in 1..100", quality);
    JpegErrors e;
    unsigned char* buffer = nullptr;
    unsigned long bytes = 0;
    jpeg_compress_struct cinfo;
    std::memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = jpeg_on_error;
    if (setjmp(e.jump)) {
        jpeg_destroy_compress(&cinfo);
        std::free(buffer);
        MT_CHECK(false, "JPEG encode failed: {}", e.message);
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, &buffer, &bytes);
    cinfo.image_width = static_cast<JDIMENSION>(width);
    cinfo.image_height = static_cast<JDIMENSION>(height);
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + static_cast<size_t>(cinfo.next_scanline) * width * 3;
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    std::vector<uint8_t> out(buffer, buffer + bytes);
    std::free(buffer);
    return out;
}

}  // namespace mt::data
