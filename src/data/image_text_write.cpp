// Writing WebDataset shards and JSONL manifests of image-caption samples (image_text_write.h).
#include "data/image_text_write.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"
#include "data/shapes_vocab.h"
#include "data/tar_archive.h"

namespace mt::data {

namespace fs = std::filesystem;

// The shard being filled and the manifest being written.
struct ImageTextWriter::Files {
    std::unique_ptr<TarWriter> shard;
    int64_t in_shard = 0;
    std::unique_ptr<core::AtomicFileWriter> manifest;
};

ImageTextWriter::ImageTextWriter(ImageTextWriteOptions options)
    : options_(std::move(options)), files_(std::make_unique<Files>()) {
    MT_CHECK(options_.per_shard >= 1, "image-text writer: {} samples per shard", options_.per_shard);
    std::error_code ec;
    fs::create_directories(options_.out_dir, ec);
    if (ec) core::fail(core::ExitCode::data, "cannot create directory: {} [{}]", ec.message(), options_.out_dir);
    if (options_.manifest) {
        fs::create_directories(fs::path(options_.out_dir) / options_.prefix, ec);
        if (ec) core::fail(core::ExitCode::data, "cannot create directory: {} [{}]", ec.message(), options_.out_dir);
        result_.manifest = (fs::path(options_.out_dir) / (options_.prefix + ".jsonl")).string();
        files_->manifest = std::make_unique<core::AtomicFileWriter>(result_.manifest, core::ExitCode::data);
    }
}

ImageTextWriter::~ImageTextWriter() = default;

void ImageTextWriter::add_encoded(const std::string& key,
                                  const std::vector<uint8_t>& image,
                                  ImageFormat format,
                                  const std::string& caption) {
    MT_CHECK(format != ImageFormat::unknown, "image-text writer: sample {} has no image format", key);
    const std::string ext = format == ImageFormat::png ? ".png" : ".jpg";
    if (!files_->shard) {
        const std::string path =
            (fs::path(options_.out_dir) / fmt::format("{}-{:06d}.tar", options_.prefix, std::ssize(result_.shards)))
                .string();
        result_.shards.push_back(path);
        files_->shard = std::make_unique<TarWriter>(path);
        files_->in_shard = 0;
    }
    files_->shard->add(key + ext, image);
    files_->shard->add(key + ".txt", std::vector<uint8_t>(caption.begin(), caption.end()));
    if (++files_->in_shard == options_.per_shard) {
        files_->shard->finish();
        files_->shard.reset();
    }
    if (files_->manifest) {
        const std::string relative = options_.prefix + "/" + key + ext;
        core::write_file_atomic(
            (fs::path(options_.out_dir) / relative).string(), image.data(), image.size(), core::ExitCode::data);
        files_->manifest->write(nlohmann::json{{"image", relative}, {"text", caption}}.dump() + "\n");
    }
    ++result_.samples;
}

void ImageTextWriter::add_rgb(
    const std::string& key, const std::vector<uint8_t>& rgb, int height, int width, const std::string& caption) {
    const std::vector<uint8_t> bytes = options_.format == ImageFormat::jpeg
                                           ? image_encode_jpeg(rgb, height, width, options_.jpeg_quality)
                                           : image_encode_png(rgb, height, width);
    add_encoded(key, bytes, options_.format == ImageFormat::jpeg ? ImageFormat::jpeg : ImageFormat::png, caption);
}

ImageTextWriteResult ImageTextWriter::finish() {
    if (files_->shard) files_->shard->finish();
    files_->shard.reset();
    if (files_->manifest) files_->manifest->commit();
    files_->manifest.reset();
    return result_;
}

ImageTextWriteResult image_text_write_shapes(const ShapesOptions& shapes,
                                             ShapesSplit split,
                                             int64_t count,
                                             const ImageTextWriteOptions& options) {
    MT_CHECK(count >= 1, "shapes shards of {} samples", count);
    ShapesOptions o = shapes;
    if (split != ShapesSplit::train) o.val_size = count;  // the fixed split is exactly the samples written
    const ShapesDataset dataset(o);
    ImageTextWriter writer(options);
    for (int64_t i = 0; i < count; ++i) {
        const ShapesSample s = dataset.sample(split, static_cast<uint64_t>(i));
        const ShapesImage image = shapes_render(s.scene);
        // The words of the text, without the final <eos>: a reader's tokenizer ends the caption with its own EOT.
        const std::span<const int32_t> words(s.text.data(), s.text.size() - 1);
        writer.add_rgb(fmt::format("{:08d}", i), image.rgb, image.height, image.width, shapes_decode(words));
    }
    return writer.finish();
}

ImageTextWriteResult image_text_write_folder(const std::string& folder, const ImageTextWriteOptions& options) {
    if (!fs::is_directory(folder)) core::fail(core::ExitCode::data, "not a directory of images [{}]", folder);
    std::vector<fs::path> images;
    for (const fs::directory_entry& e : fs::directory_iterator(folder))
        if (e.is_regular_file() && image_format_of_name(e.path().filename().string()) != ImageFormat::unknown)
            images.push_back(e.path());
    std::sort(images.begin(), images.end());
    if (images.empty()) core::fail(core::ExitCode::data, "no .png, .jpg or .jpeg image in the folder [{}]", folder);
    // Everything is checked before the first shard is written, so a bad folder leaves no output behind.
    auto key_of = [](const fs::path& image) {
        std::string key = image.stem().string();
        std::replace(key.begin(), key.end(), '.', '_');  // a '.' would end the WebDataset key early
        return key;
    };
    auto caption_of = [](fs::path image) { return image.replace_extension(".txt"); };
    for (size_t i = 0; i < images.size(); ++i) {
        const fs::path& image = images[i];
        if (!fs::is_regular_file(caption_of(image)))
            core::fail_hint(core::ExitCode::data,
                            "every image needs its caption in a .txt file of the same name",
                            "missing caption {} for the image [{}]",
                            caption_of(image).filename().string(),
                            image.string());
        if (i > 0 && key_of(images[i - 1]) == key_of(image))
            core::fail(core::ExitCode::data,
                       "two images with the key \"{}\" ({} and {}) [{}]",
                       key_of(image),
                       images[i - 1].filename().string(),
                       image.filename().string(),
                       folder);
        const std::string bytes = core::read_file(image.string(), core::ExitCode::data);
        try {
            (void)image_probe_size(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
        } catch (const core::Error& e) {
            core::fail(core::ExitCode::data, "{} [{}]", e.what(), image.string());
        }
    }
    ImageTextWriter writer(options);
    for (const fs::path& image : images) {
        const std::string bytes = core::read_file(image.string(), core::ExitCode::data);
        const std::vector<uint8_t> data(bytes.begin(), bytes.end());
        std::string caption = core::read_file(caption_of(image).string(), core::ExitCode::data);
        while (!caption.empty() && std::isspace(static_cast<unsigned char>(caption.back()))) caption.pop_back();
        writer.add_encoded(key_of(image), data, image_format_of(data), caption);
    }
    return writer.finish();
}

}  // namespace mt::data
