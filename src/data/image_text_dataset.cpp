// The index of image-caption samples on disk: WebDataset tar shards and JSONL manifests (image_text_dataset.h).
#include "data/image_text_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/file_util.h"
#include "data/image_codec.h"
#include "data/tar_archive.h"

namespace mt::data {

namespace {

// The image header lies in the first bytes almost always (a JPEG's EXIF block can push its frame header back, up to
// 64 KiB); when the prefix does not hold it, the whole image is read.
constexpr int64_t kProbeBytes = int64_t{1} << 16;

std::string rstrip(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    return s;
}

// The caption of a .json member: its "caption", else "text" string. Throws Error(data) otherwise.
std::string caption_from_json(const std::string& text, const std::string& name) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) core::fail(core::ExitCode::data, "caption {} is not a JSON object", name);
    for (const char* field : {"caption", "text"})
        if (j.contains(field) && j[field].is_string()) return j[field].get<std::string>();
    core::fail(core::ExitCode::data, "missing caption: {} has no \"caption\" or \"text\" string", name);
}

// A message without the " [path]" the lower layers end theirs with, so that the sample's place can replace it.
std::string strip_place(const std::string& message, const std::string& path) {
    const std::string tail = " [" + path + "]";
    if (message.size() >= tail.size() && message.compare(message.size() - tail.size(), tail.size(), tail) == 0)
        return message.substr(0, message.size() - tail.size());
    return message;
}

// The first `max` bytes of a file (max < 0: all). Throws Error(data) naming the file when it cannot be read.
std::vector<uint8_t> read_file_prefix(const std::string& path, int64_t max) {
    const int64_t size = static_cast<int64_t>(core::file_size(path, core::ExitCode::data));
    const int64_t n = max < 0 ? size : std::min(size, max);
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    std::ifstream in(path, std::ios::binary);
    if (!in || !in.read(reinterpret_cast<char*>(bytes.data()), n))
        core::fail(core::ExitCode::data, "cannot read image file [{}]", path);
    return bytes;
}

// The size of an image from its first bytes; nullopt with *error set when they do not give one.
std::optional<ImageSize> try_probe(const std::vector<uint8_t>& bytes, std::string* error) {
    try {
        return image_probe_size(bytes);
    } catch (const core::Error& e) {
        *error = e.what();
        return std::nullopt;
    }
}

}  // namespace

std::string image_text_where_tar(const std::string& shard, const std::string& key) {
    return fmt::format("[{}, sample \"{}\"]", shard, key);
}

void image_text_split_name(const std::string& name, std::string* key, std::string* ext) {
    const size_t slash = name.rfind('/');
    const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
    *key = name.substr(0, dot);
    *ext = dot == std::string::npos ? "" : name.substr(dot + 1);
    std::transform(ext->begin(), ext->end(), ext->begin(), [](unsigned char c) { return std::tolower(c); });
}

ImageTextDataset::ImageTextDataset(const std::string& format,
                                   const std::vector<std::string>& paths,
                                   ImageTextDatasetOptions options)
    : format_(format), options_(options), sources_(paths) {
    if (format != "webdataset" && format != "image_jsonl")
        core::fail(core::ExitCode::usage, "image-text format \"{}\" is not webdataset or image_jsonl", format);
    if (paths.empty()) core::fail(core::ExitCode::usage, "no {} paths given", format);
    for (size_t s = 0; s < paths.size(); ++s) {
        if (format == "webdataset")
            index_webdataset(static_cast<int32_t>(s), paths[s]);
        else
            index_jsonl(static_cast<int32_t>(s), paths[s]);
    }
    if (samples_.empty())
        core::fail(core::ExitCode::data,
                   "no image-caption sample in the {} {} ({} bad samples skipped) [{}]",
                   paths.size(),
                   format == "webdataset" ? "tar shard(s)" : "manifest(s)",
                   skipped_index_,
                   paths.front());
}

void ImageTextDataset::bad_at_index(const std::string& message, const std::string& where) {
    if (!options_.skip_bad_samples)
        throw core::Error(core::ExitCode::data,
                          message + " " + where,
                          "fix or remove the sample, or set data.skip_bad_samples = true to skip bad samples");
    ++skipped_index_;
    if (options_.log)
        fmt::print("moetrain: warning: skipped bad sample ({} so far): {} {}\n", skipped(), message, where);
}

void ImageTextDataset::index_webdataset(int32_t source, const std::string& path) {
    // The sample being gathered: its members so far.
    struct Group {
        std::string key;
        std::vector<std::string> images;
        int64_t image_offset = -1;
        std::optional<ImageSize> size;
        std::string image_error;
        std::optional<std::string> txt, json;
        std::string json_name;
    };
    std::optional<Group> group;
    auto finish = [&](Group& g) {
        const std::string where = image_text_where_tar(path, g.key);
        if (g.images.size() > 1)
            return bad_at_index(fmt::format("two images in one sample ({})", fmt::join(g.images, ", ")), where);
        if (g.images.empty()) return bad_at_index("no image (.png, .jpg or .jpeg) in the sample", where);
        if (!g.image_error.empty())
            return bad_at_index(fmt::format("corrupt image {}: {}", g.images[0], g.image_error), where);
        if (!g.txt && !g.json) return bad_at_index("missing caption: the sample has no .txt or .json member", where);
        ImageTextSample s;
        s.source = source;
        s.key = g.key;
        s.image = g.images[0];
        s.image_offset = g.image_offset;
        s.size = *g.size;
        if (g.txt) {
            s.caption = rstrip(*g.txt);
        } else {
            try {
                s.caption = caption_from_json(*g.json, g.json_name);
            } catch (const core::Error& e) {
                return bad_at_index(e.what(), where);
            }
        }
        samples_.push_back(std::move(s));
    };
    TarReader reader(path);  // a missing or unreadable shard is an error even when skipping samples
    // Only the reader's errors mean a damaged shard; a bad sample's error (bad_at_index) passes through.
    bool reading = false;
    auto read = [&](int64_t max_bytes) {
        reading = true;
        std::vector<uint8_t> bytes = reader.read(max_bytes);
        reading = false;
        return bytes;
    };
    try {
        TarMember m;
        for (;;) {
            reading = true;
            const bool more = reader.next(&m);
            reading = false;
            if (!more) break;
            std::string key, ext;
            image_text_split_name(m.name, &key, &ext);
            if (!group || group->key != key) {
                if (group) finish(*group);
                group.emplace();
                group->key = key;
            }
            Group& g = *group;
            if (ext == "png" || ext == "jpg" || ext == "jpeg") {
                g.images.push_back(m.name);
                if (g.images.size() > 1) continue;
                g.image_offset = m.header_offset;
                std::vector<uint8_t> head = read(kProbeBytes);
                g.size = try_probe(head, &g.image_error);
                if (!g.size && std::ssize(head) < m.size) {  // the header lies further in: read the whole image
                    const std::vector<uint8_t> rest = read(-1);
                    head.insert(head.end(), rest.begin(), rest.end());
                    g.size = try_probe(head, &g.image_error);
                }
                if (g.size) g.image_error.clear();
            } else if (ext == "txt") {
                const std::vector<uint8_t> bytes = read(-1);
                g.txt = std::string(bytes.begin(), bytes.end());
            } else if (ext == "json") {
                const std::vector<uint8_t> bytes = read(-1);
                g.json = std::string(bytes.begin(), bytes.end());
                g.json_name = m.name;
            }
        }
        if (group) finish(*group);
    } catch (const core::Error& e) {
        if (!reading) throw;
        // The shard itself is damaged (cut short): name the sample being read, keep the ones before it.
        const std::string where = image_text_where_tar(path, group ? group->key : std::string("(the first)"));
        bad_at_index(
            strip_place(e.what(), path) + (options_.skip_bad_samples ? "; the rest of the shard is left out" : ""),
            where);
    }
}

void ImageTextDataset::index_jsonl(int32_t source, const std::string& path) {
    (void)core::file_size(path, core::ExitCode::data);  // missing, or not a regular file: named
    std::ifstream in(path);
    if (!in) core::fail(core::ExitCode::data, "cannot open manifest [{}]", path);
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
        if (std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); })) continue;
        std::string where = fmt::format("[{} line {}]", path, n);
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            bad_at_index("malformed manifest line: not a JSON object", where);
            continue;
        }
        if (!j.contains("image") || !j["image"].is_string()) {
            bad_at_index("manifest line without an \"image\" string", where);
            continue;
        }
        ImageTextSample s;
        s.source = source;
        s.key = j["image"].get<std::string>();
        s.line = n;
        where = fmt::format("[{} line {}, image \"{}\"]", path, n, s.key);
        const char* field = j.contains("text") ? "text" : "caption";
        if (!j.contains(field) || !j[field].is_string()) {
            bad_at_index("missing caption: the line has no \"text\" string", where);
            continue;
        }
        s.caption = j[field].get<std::string>();
        const std::filesystem::path image(s.key);
        s.image = (image.is_absolute() ? image : folder / image).string();
        std::optional<ImageSize> size;
        std::string error;
        try {
            const int64_t total = static_cast<int64_t>(core::file_size(s.image, core::ExitCode::data));
            std::vector<uint8_t> head = read_file_prefix(s.image, kProbeBytes);
            size = try_probe(head, &error);
            if (!size && std::ssize(head) < total) size = try_probe(read_file_prefix(s.image, -1), &error);
        } catch (const core::Error& e) {  // a missing or unreadable file
            error = strip_place(e.what(), s.image);
        }
        if (!size) {
            bad_at_index(fmt::format("bad image {}: {}", s.image, error), where);
            continue;
        }
        s.size = *size;
        samples_.push_back(std::move(s));
    }
}

std::vector<uint8_t> ImageTextDataset::read_image(int64_t i) const {
    const ImageTextSample& s = sample(i);
    try {
        if (s.image_offset >= 0)
            return tar_read_member(sources_[static_cast<size_t>(s.source)], s.image_offset, s.image);
        return read_file_prefix(s.image, -1);
    } catch (const core::Error& e) {  // where(i) names the shard or file, and the sample
        throw core::Error(
            e.code(), strip_place(e.what(), s.image_offset >= 0 ? sources_[s.source] : s.image), e.hint());
    }
}

std::string ImageTextDataset::where(int64_t i) const {
    const ImageTextSample& s = sample(i);
    const std::string& source = sources_[static_cast<size_t>(s.source)];
    if (s.line > 0) return fmt::format("[{} line {}, image \"{}\"]", source, s.line, s.key);
    return image_text_where_tar(source, s.key);
}

void ImageTextDataset::report_bad(int64_t i, const core::Error& error) const {
    if (!options_.skip_bad_samples)
        throw core::Error(core::ExitCode::data,
                          std::string(error.what()) + " " + where(i),
                          "fix or remove the sample, or set data.skip_bad_samples = true to skip bad samples");
    std::lock_guard<std::mutex> lock(bad_mutex_);
    if (!bad_later_.insert(i).second) return;
    ++skipped_later_;
    if (options_.log_batches)
        fmt::print("moetrain: warning: skipped bad sample ({} so far): {} {}\n", skipped(), error.what(), where(i));
}

}  // namespace mt::data
