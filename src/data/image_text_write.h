// Writing image-caption data in the formats moetrain reads (docs/data.md "Image-text data"), for `moetrain data
// --images`: WebDataset tar shards of KEY.png|jpg + KEY.txt, and optionally a JSONL manifest beside image files.
// Samples come from the shapes generator (data/shapes.h) or from a folder of images with captions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/image_codec.h"
#include "data/shapes.h"

namespace mt::data {

struct ImageTextWriteOptions {
    std::string out_dir;           // created when missing
    std::string prefix = "train";  // shards <out_dir>/<prefix>-000000.tar, ...; manifest <out_dir>/<prefix>.jsonl
    int64_t per_shard = 1000;      // samples per tar shard
    ImageFormat format = ImageFormat::png;  // how generated images are encoded (png or jpeg)
    int jpeg_quality = 95;
    // Also write every image to <out_dir>/<prefix>/KEY.ext and a manifest whose lines are
    // {"image": "<prefix>/KEY.ext", "text": caption} (image paths relative to the manifest's folder).
    bool manifest = false;
};

struct ImageTextWriteResult {
    int64_t samples = 0;
    std::vector<std::string> shards;
    std::string manifest;  // empty without options.manifest
};

// Writes samples one after another into shards of options.per_shard samples. Every file goes to NAME.tmp first and
// is renamed when complete.
class ImageTextWriter {
   public:
    // @param[in] options  where and how to write
    explicit ImageTextWriter(ImageTextWriteOptions options);
    ~ImageTextWriter();

    // Adds a sample whose image is already encoded (PNG or JPEG bytes, kept as they are).
    // @param[in] key      the sample key: a file name without extension, unique, without '.' after its last '/'
    // @param[in] image    the encoded image
    // @param[in] format   its format (the member's extension: png or jpg)
    // @param[in] caption  UTF-8 text
    void add_encoded(const std::string& key,
                     const std::vector<uint8_t>& image,
                     ImageFormat format,
                     const std::string& caption);
    // Adds a sample from RGB pixels, encoded as options.format.
    // @param[in] key            as for add_encoded
    // @param[in] rgb            [height, width, 3]
    // @param[in] height, width  the image size
    // @param[in] caption        UTF-8 text
    void add_rgb(
        const std::string& key, const std::vector<uint8_t>& rgb, int height, int width, const std::string& caption);
    // Closes the last shard and the manifest; returns what was written.
    ImageTextWriteResult finish();

   private:
    struct Files;
    ImageTextWriteOptions options_;
    std::unique_ptr<Files> files_;
    ImageTextWriteResult result_;
};

// Writes `count` samples of a shapes split (indices 0..count-1; the val and comp-val splits hold count samples), each
// image at its native size and its caption (or VQA text) as words without <eos>. Keys are the indices, 8 digits.
// @param[in] shapes   generator options (seed, stage, held-out pairs, format)
// @param[in] split    train, val or comp_val
// @param[in] count    samples, >= 1
// @param[in] options  output
ImageTextWriteResult image_text_write_shapes(const ShapesOptions& shapes,
                                             ShapesSplit split,
                                             int64_t count,
                                             const ImageTextWriteOptions& options);

// Writes every image of a folder (KEY.png, KEY.jpg or KEY.jpeg directly inside it, in name order, bytes kept as they
// are) with the caption in KEY.txt beside it (trailing whitespace removed). An image without its .txt, or whose
// header does not read as PNG or JPEG, ends with Error(ExitCode::data) naming the file, before any shard is complete.
// @param[in] folder   the images and captions
// @param[in] options  output
ImageTextWriteResult image_text_write_folder(const std::string& folder, const ImageTextWriteOptions& options);

}  // namespace mt::data
