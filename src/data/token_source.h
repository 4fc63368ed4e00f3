// TokenSource: a list of token files (llm.c shards or Megatron datasets) presented as one stream of int32 token
// ids, the concatenation of all files in the order given. Reads are const and thread-safe (mmap only); a file that
// shrinks under its map makes a read fail with exit 3 naming it instead of killing the process (core/signals.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

class TokenSource {
   public:
    virtual ~TokenSource() = default;
    // Total tokens across all files.
    virtual int64_t num_tokens() const = 0;
    virtual int64_t vocab_size() const = 0;
    // Copies tokens [start, start + count) of the stream into out. Every id is checked against vocab_size; an id
    // outside [0, vocab_size) throws Error(ExitCode::data) naming the file, the token index within it and the id.
    // @param[in]  start  first token (0 <= start, start + count <= num_tokens())
    // @param[in]  count  number of tokens
    // @param[out] out    count int32 values
    virtual void read(int64_t start, int64_t count, int32_t* out) const = 0;
    // One line: format, file count, tokens.
    virtual std::string describe() const = 0;
    // The token files, comma-separated (at most a few, then "and N more"), for messages.
    virtual std::string file_list() const = 0;
    // Fails with Error(ExitCode::data) naming the file when a file changed on disk since it was opened (truncated,
    // rewritten in place or replaced); a stat per file.
    virtual void check_unchanged() const = 0;
};

// Opens every file of a token source. format is "llmc" (paths are shard files) or "megatron" (paths are
// prefixes, or PREFIX.bin / PREFIX.idx). An empty list, an unknown format or a file without tokens throws
// Error (ExitCode::usage for the first two, ExitCode::data otherwise); so does any invalid file.
// @param[in] format      "llmc" or "megatron"
// @param[in] paths       files in stream order
// @param[in] vocab_size  the model's vocab; token ids must be below it
std::unique_ptr<TokenSource> token_source_open(std::string_view format,
                                               const std::vector<std::string>& paths,
                                               int64_t vocab_size);

}  // namespace mt::data
