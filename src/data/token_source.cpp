// TokenSource over llm.c shards and Megatron datasets: a prefix sum of file sizes maps a stream position to
// (file, index); ids are widened, range-checked against the vocab and narrowed to int32.
#include "data/token_source.h"

#include <algorithm>

#include "core/error.h"
#include "core/signals.h"
#include "data/llmc_shard.h"
#include "data/megatron_dataset.h"

namespace mt::data {

using core::ExitCode;

std::string_view token_type_name(TokenType t) {
    switch (t) {
        case TokenType::u8:
            return "u8";
        case TokenType::i8:
            return "i8";
        case TokenType::i16:
            return "i16";
        case TokenType::u16:
            return "u16";
        case TokenType::i32:
            return "i32";
        case TokenType::u32:
            return "u32";
        case TokenType::i64:
            return "i64";
    }
    return "?";
}

namespace {

struct FileEntry {
    std::unique_ptr<LlmcShard> llmc;
    std::unique_ptr<MegatronDataset> megatron;
    std::string path;  // the file that holds the tokens (shard, or PREFIX.bin)
    TokenView view;
    int64_t begin = 0;  // first stream position
};

class FileTokenSource final : public TokenSource {
   public:
    FileTokenSource(std::string format, std::vector<FileEntry> files, int64_t vocab_size)
        : format_(std::move(format)), files_(std::move(files)), vocab_size_(vocab_size) {
        for (const auto& f : files_) total_ += f.view.count;
    }

    int64_t num_tokens() const override {
        return total_;
    }
    int64_t vocab_size() const override {
        return vocab_size_;
    }
    std::string describe() const override {
        return fmt::format("{}: {} file(s), {} tokens", format_, files_.size(), total_);
    }
    std::string file_list() const override {
        constexpr size_t kShown = 3;
        std::string out;
        for (size_t i = 0; i < std::min(files_.size(), kShown); ++i) out += (i ? ", " : "") + files_[i].path;
        if (files_.size() > kShown) out += fmt::format(" and {} more", files_.size() - kShown);
        return out;
    }
    void check_unchanged() const override {
        for (const auto& f : files_) {
            if (f.llmc) f.llmc->check_unchanged();
            if (f.megatron) f.megatron->check_unchanged();
        }
    }

    void read(int64_t start, int64_t count, int32_t* out) const override {
        MT_CHECK(start >= 0 && count >= 0 && start + count <= total_,
                 "read [{}, {}) outside the {} tokens of {}",
                 start,
                 start + count,
                 total_,
                 format_);
        // The last file whose begin <= start.
        auto it = std::upper_bound(
            files_.begin(), files_.end(), start, [](int64_t pos, const FileEntry& f) { return pos < f.begin; });
        size_t fi = static_cast<size_t>(std::distance(files_.begin(), it)) - 1;
        // A file truncated under its map raises SIGBUS in the copy loop: the guard turns it into exit 3 naming the
        // file. The loop holds only plain values, which the recovery may jump over.
        core::signals_guard_mapped_reads([&]() {
            while (count > 0) {
                const FileEntry& f = files_[fi];
                const int64_t local = start - f.begin;
                const int64_t n = std::min(count, f.view.count - local);
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t id = token_view_get(f.view, local + i);
                    if (id < 0 || id >= vocab_size_) report_bad_token(f, local + i, id);
                    out[i] = static_cast<int32_t>(id);
                }
                out += n;
                start += n;
                count -= n;
                ++fi;
            }
        });
    }

   private:
    [[noreturn]] void report_bad_token(const FileEntry& f, int64_t index, int64_t id) const {
        const std::string hint =
            "the data was tokenized with a different vocabulary; check the model's vocab_size and the tokenizer.";
        if (f.megatron)
            core::fail_hint(ExitCode::data,
                            hint,
                            "token id {} >= vocab size {} (or negative) at token {} (sequence {}) [{}]",
                            id,
                            vocab_size_,
                            index,
                            f.megatron->sequence_of_token(index),
                            f.path);
        core::fail_hint(ExitCode::data,
                        hint,
                        "token id {} >= vocab size {} (or negative) at token {} [{}]",
                        id,
                        vocab_size_,
                        index,
                        f.path);
    }

    std::string format_;
    std::vector<FileEntry> files_;
    int64_t vocab_size_;
    int64_t total_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> token_source_open(std::string_view format,
                                               const std::vector<std::string>& paths,
                                               int64_t vocab_size) {
    if (format != "llmc" && format != "megatron")
        core::fail(ExitCode::usage, "unknown data format \"{}\" (expected \"llmc\" or \"megatron\")", format);
    if (paths.empty())
        core::fail_hint(ExitCode::usage, "list token files in data.paths.", "no {} token files given", format);
    if (vocab_size <= 0 || vocab_size > INT32_MAX)
        core::fail(ExitCode::usage, "vocab size {} is out of range for int32 token ids", vocab_size);
    std::vector<FileEntry> files;
    int64_t begin = 0;
    for (const auto& path : paths) {
        FileEntry f;
        if (format == "llmc") {
            f.llmc = std::make_unique<LlmcShard>(path);
            f.path = f.llmc->path();
            f.view = f.llmc->tokens();
        } else {
            f.megatron = std::make_unique<MegatronDataset>(path);
            f.path = f.megatron->bin_path();
            f.view = f.megatron->tokens();
        }
        if (f.view.count == 0)
            core::fail_hint(
                ExitCode::data, "remove empty files from data.paths.", "token file holds no tokens [{}]", f.path);
        f.begin = begin;
        begin += f.view.count;
        files.push_back(std::move(f));
    }
    return std::make_unique<FileTokenSource>(std::string(format), std::move(files), vocab_size);
}

}  // namespace mt::data
