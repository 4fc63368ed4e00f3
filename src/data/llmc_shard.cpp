// Reader and writer of llm.c token shards; the validation messages follow conventions §3.
#include "data/llmc_shard.h"

#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace mt::data {

using core::ExitCode;

void llmc_write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
    MT_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 32), "bad vocab size {}", vocab_size);
    if (tokens.size() >= (size_t{1} << 31))
        core::fail(ExitCode::data, "an llm.c shard holds fewer than 2^31 tokens, got {} [{}]", tokens.size(), path);
    const bool narrow = vocab_size <= 65536;
    std::array<int32_t, 256> header{};
    header[0] = narrow ? kLlmcMagicU16 : kLlmcMagicU32;
    header[1] = narrow ? kLlmcVersionU16 : kLlmcVersionU32;
    header[2] = static_cast<int32_t>(tokens.size());
    const size_t width = narrow ? 2 : 4;
    std::vector<uint8_t> payload(tokens.size() * width);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const int32_t t = tokens[i];
        if (t < 0 || t >= vocab_size)
            core::fail(ExitCode::data, "token {} at index {} is outside the vocab of {} [{}]", t, i, vocab_size, path);
        if (narrow) {
            const uint16_t v = static_cast<uint16_t>(t);
            std::memcpy(&payload[i * 2], &v, 2);
        } else {
            const uint32_t v = static_cast<uint32_t>(t);
            std::memcpy(&payload[i * 4], &v, 4);
        }
    }
    core::AtomicFileWriter out(path, core::ExitCode::data);
    out.write(header.data(), sizeof(header));
    out.write(payload.data(), payload.size());
    out.commit();
}

LlmcShard::LlmcShard(const std::string& path) : file_(path, core::ExitCode::data) {
    const size_t size = file_.size();
    if (size < kLlmcHeaderBytes)
        core::fail_hint(ExitCode::data,
                        "the file is truncated or is not an llm.c shard; re-tokenize it or remove it from data.paths.",
                        "file holds {} bytes, less than the 1024-byte llm.c shard header [{}]",
                        size,
                        path);
    int32_t header[3];
    std::memcpy(header, file_.data(), sizeof(header));
    const int32_t magic = header[0], version = header[1], n = header[2];
    TokenType type;
    if (magic == kLlmcMagicU16) {
        type = TokenType::u16;
        if (version != kLlmcVersionU16)
            core::fail_hint(ExitCode::data,
                            "magic 20240520 (uint16 tokens) goes with version 1; re-tokenize this shard.",
                            "unsupported llm.c shard version {} for magic {} (expected {}) [{}]",
                            version,
                            magic,
                            kLlmcVersionU16,
                            path);
    } else if (magic == kLlmcMagicU32) {
        type = TokenType::u32;
        if (version != kLlmcVersionU32)
            core::fail_hint(ExitCode::data,
                            "magic 20240801 (uint32 tokens) goes with version 7; re-tokenize this shard.",
                            "unsupported llm.c shard version {} for magic {} (expected {}) [{}]",
                            version,
                            magic,
                            kLlmcVersionU32,
                            path);
    } else {
        core::fail_hint(ExitCode::data,
                        "this is not an llm.c shard; for Megatron .bin/.idx data set data.format = \"megatron\".",
                        "bad llm.c shard magic {} (expected {} or {}) [{}]",
                        magic,
                        kLlmcMagicU16,
                        kLlmcMagicU32,
                        path);
    }
    if (n < 0)
        core::fail_hint(ExitCode::data,
                        "the header is corrupt; re-tokenize this shard.",
                        "shard header says {} tokens [{}]",
                        n,
                        path);
    const size_t width = token_type_size(type);
    const size_t expected = kLlmcHeaderBytes + static_cast<size_t>(n) * width;
    if (size != expected) {
        const size_t held = (size - kLlmcHeaderBytes) / width;
        core::fail_hint(ExitCode::data,
                        size < expected ? "the file is truncated; re-tokenize this shard or remove it from data.paths."
                                        : "the file has bytes after its last token; re-tokenize this shard.",
                        "shard header says {} tokens but the file holds {} (expected {} bytes, found {}) [{}]",
                        n,
                        held,
                        expected,
                        size,
                        path);
    }
    view_.data = file_.data() + kLlmcHeaderBytes;
    view_.count = n;
    view_.type = type;
}

}  // namespace mt::data
