// llm.c token shards (conventions §4.1): a 1024-byte header of 256 int32 (magic, version, token count) followed
// by uint16 (magic 20240520, version 1) or uint32 (magic 20240801, version 7) little-endian tokens.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/file_util.h"
#include "data/token_view.h"

namespace mt::data {

constexpr int32_t kLlmcMagicU16 = 20240520;
constexpr int32_t kLlmcVersionU16 = 1;
constexpr int32_t kLlmcMagicU32 = 20240801;
constexpr int32_t kLlmcVersionU32 = 7;
constexpr size_t kLlmcHeaderBytes = 1024;

// Writes a shard atomically (PATH.tmp, fsync, rename). Tokens are stored as uint16 when vocab_size <= 65536,
// else uint32. Every token must lie in [0, vocab_size).
// @param[in] path        output file
// @param[in] tokens      token ids
// @param[in] vocab_size  decides the token width
void llmc_write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

// A shard mapped read-only. The constructor validates existence, magic, version, token count and the exact file
// size, throwing Error(ExitCode::data) with a message naming the file.
class LlmcShard {
   public:
    explicit LlmcShard(const std::string& path);

    const std::string& path() const {
        return file_.path();
    }
    int64_t num_tokens() const {
        return view_.count;
    }
    int token_bytes() const {
        return static_cast<int>(token_type_size(view_.type));
    }
    const TokenView& tokens() const {
        return view_;
    }
    // Fails with exit 3 naming the file when it changed on disk since it was mapped (core::MappedFile).
    void check_unchanged() const {
        file_.check_unchanged();
    }

   private:
    core::MappedFile file_;
    TokenView view_;
};

}  // namespace mt::data
