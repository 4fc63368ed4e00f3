// Image-caption samples on disk (docs/data.md "Image-text data"): WebDataset tar shards (`data.format =
// "webdataset"`) and JSONL manifests of (image path, text) pairs (`"image_jsonl"`). Opening a dataset indexes every
// sample up front (where its image is, its size from the image header, its caption), so sample i is addressable and
// the trainer's rows stay functions of their index. A bad sample stops the run with exit 3 naming the shard (or
// manifest line) and the sample key, or, with data.skip_bad_samples, is skipped with a counted warning.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/image_prep.h"

namespace mt::data {

// One image-caption sample.
struct ImageTextSample {
    int32_t source = 0;         // index into ImageTextDataset::sources(): the shard or the manifest
    std::string key;            // WebDataset: the sample key; JSONL: the "image" field as written
    int64_t line = 0;           // JSONL: the 1-based line of the manifest; WebDataset: 0
    std::string image;          // WebDataset: the image member's name; JSONL: the image's path (resolved)
    int64_t image_offset = -1;  // WebDataset: the image member's header offset in the shard; JSONL: -1
    ImageSize size;             // from the image header
    std::string caption;        // UTF-8
};

struct ImageTextDatasetOptions {
    // data.skip_bad_samples: skip a bad sample with a warning (and count it) instead of stopping with exit 3.
    bool skip_bad_samples = false;
    // Print the warnings of samples found bad while indexing (every rank indexes the same: rank 0 prints them).
    bool log = true;
    // Print the warnings of samples found bad while making batches (each rank decodes its own samples, so every rank
    // prints its own).
    bool log_batches = true;
};

class ImageTextDataset {
   public:
    // Indexes the samples of every path, in path order:
    //   * "webdataset": each path is an uncompressed tar. Consecutive members with the same key (the member name up
    //     to the first '.' after its last '/') form a sample: one image (.png, .jpg or .jpeg) and a caption, a .txt
    //     (the text, trailing whitespace removed) or, when there is no .txt, a .json object whose "caption" (else
    //     "text") string is the caption. Members with other extensions are ignored.
    //   * "image_jsonl": each path is a manifest with one JSON object per line, {"image": PATH, "text": CAPTION}
    //     ("caption" is accepted for "text"); PATH is absolute or relative to the manifest's folder. Blank lines are
    //     passed over.
    // Bad samples (no image, no caption, two images, a damaged image header, a missing image file, a line that is
    // not such an object) throw Error(ExitCode::data) "<what> [<shard>, sample \"<key>\"]" or, with
    // skip_bad_samples, are left out with a warning. A truncated tar is reported with the key of the sample being
    // read; when skipped, the samples before it are kept. A path that cannot be read at all, or a dataset left with no
    // sample, is an error either way.
    // @param[in] format   "webdataset" or "image_jsonl"
    // @param[in] paths    the shards or manifests
    // @param[in] options  skip_bad_samples and logging
    ImageTextDataset(const std::string& format, const std::vector<std::string>& paths, ImageTextDatasetOptions options);

    int64_t size() const {
        return std::ssize(samples_);
    }
    const ImageTextSample& sample(int64_t i) const {
        return samples_[static_cast<size_t>(i)];
    }
    const std::vector<std::string>& sources() const {
        return sources_;
    }
    const std::string& format() const {
        return format_;
    }

    // The bytes of sample i's image (from its shard, or its file). Throws Error(ExitCode::data) saying what went
    // wrong when they cannot be read; report_bad (or the caller) adds where(i).
    std::vector<uint8_t> read_image(int64_t i) const;

    // "[shard.tar, sample \"key\"]" or "[manifest.jsonl line 7, image \"a.png\"]": where an error message points.
    std::string where(int64_t i) const;

    // Handles a sample found bad after indexing (an image that does not decode): with skip_bad_samples, prints a
    // warning the first time sample i fails and returns; otherwise throws Error(ExitCode::data) with the message and
    // where(i). Thread-safe.
    // @param[in] i      the sample
    // @param[in] error  what went wrong
    void report_bad(int64_t i, const core::Error& error) const;

    // Bad samples skipped so far: at indexing, and later by report_bad (each sample counted once).
    int64_t skipped() const {
        return skipped_index_ + skipped_later_.load();
    }

   private:
    void index_webdataset(int32_t source, const std::string& path);
    void index_jsonl(int32_t source, const std::string& path);
    // Skips (warning, count) or throws the error of a sample found bad while indexing.
    void bad_at_index(const std::string& message, const std::string& where);

    std::string format_;
    ImageTextDatasetOptions options_;
    std::vector<std::string> sources_;
    std::vector<ImageTextSample> samples_;
    int64_t skipped_index_ = 0;
    mutable std::atomic<int64_t> skipped_later_{0};
    mutable std::mutex bad_mutex_;
    mutable std::set<int64_t> bad_later_;  // samples report_bad has warned about
};

// "[<shard>, sample \"<key>\"]": the suffix of an error about a WebDataset sample.
std::string image_text_where_tar(const std::string& shard, const std::string& key);

// The WebDataset key and extension of a tar member name: key = the name up to the first '.' after its last '/',
// extension = the rest, lower-cased ("a/b.seg.PNG" -> "a/b", "seg.png"); a name without such a '.' has extension "".
// @param[in]  name       the member name
// @param[out] key, ext   its parts
void image_text_split_name(const std::string& name, std::string* key, std::string* ext);

}  // namespace mt::data
