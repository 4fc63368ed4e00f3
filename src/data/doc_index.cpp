// MTDOCS sidecars (write, validated read) and the document index of a token stream, from sidecars or an EOT scan.
#include "data/doc_index.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_util.h"

namespace mt::data {

using core::ExitCode;

namespace {

constexpr char kMagic[8] = {'M', 'T', 'D', 'O', 'C', 'S', '\0', '\0'};
constexpr uint32_t kHeaderBytes = 64;
constexpr size_t kRecordBytes = 16;
constexpr const char* kRebuildHint = "rebuild the token files and their .docs sidecars with `moetrain data`.";

template <typename T>
void put(std::string& buf, size_t at, T v) {
    std::memcpy(buf.data() + at, &v, sizeof(T));  // little-endian hosts only, as every moetrain format
}

template <typename T>
T get(const std::string& buf, size_t at) {
    T v;
    std::memcpy(&v, buf.data() + at, sizeof(T));
    return v;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string doc_index_sidecar(std::string_view token_path) {
    std::string_view base = token_path;
    if (ends_with(base, ".bin") || ends_with(base, ".idx")) base.remove_suffix(4);
    return std::string(base) + ".docs";
}

void doc_index_write(const std::string& path, const std::vector<int64_t>& lengths, const std::vector<uint8_t>& tagged) {
    MT_CHECK(lengths.size() == tagged.size(), "doc index: {} lengths but {} flags", lengths.size(), tagged.size());
    std::string payload(lengths.size() * kRecordBytes, '\0');
    uint64_t tokens = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
        MT_CHECK(lengths[i] > 0, "doc index: document {} has {} tokens", i, lengths[i]);
        put<uint64_t>(payload, i * kRecordBytes, static_cast<uint64_t>(lengths[i]));
        put<uint64_t>(payload, i * kRecordBytes + 8, tagged[i] ? kDocFlagLong : 0);
        tokens += static_cast<uint64_t>(lengths[i]);
    }
    std::string header(kHeaderBytes, '\0');
    std::memcpy(header.data(), kMagic, sizeof(kMagic));
    put<uint32_t>(header, 8, kDocIndexVersion);
    put<uint32_t>(header, 12, kHeaderBytes);
    put<uint64_t>(header, 16, payload.size());
    put<uint32_t>(header, 24, core::crc32c(payload.data(), payload.size()));
    put<uint32_t>(header, 28, 0);
    put<uint64_t>(header, 32, lengths.size());
    put<uint64_t>(header, 40, tokens);
    core::write_file_atomic(path, header + payload, ExitCode::data);
}

int64_t doc_index_read(const std::string& path, int64_t first, DocIndex& out) {
    const std::string bytes = core::read_file(path, ExitCode::data);
    auto bad = [&](const std::string& what) { core::fail_hint(ExitCode::data, kRebuildHint, "{} [{}]", what, path); };
    if (bytes.size() < kHeaderBytes)
        bad(fmt::format("document index is {} bytes, shorter than its {}-byte header", bytes.size(), kHeaderBytes));
    const uint32_t header_bytes = get<uint32_t>(bytes, 12);
    const uint64_t payload_bytes = get<uint64_t>(bytes, 16);
    if (header_bytes < kHeaderBytes || header_bytes % 64 != 0 || bytes.size() != header_bytes + payload_bytes)
        bad(fmt::format("document index size {} is not its header's {} + {} bytes (truncated?)",
                        bytes.size(),
                        header_bytes,
                        payload_bytes));
    if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
        bad("not a document index (bad magic, expected MTDOCS)");
    const uint32_t version = get<uint32_t>(bytes, 8);
    if (version != kDocIndexVersion)
        bad(fmt::format(
            "document index version {} is not supported (this moetrain reads {})", version, kDocIndexVersion));
    const std::string payload = bytes.substr(header_bytes);
    if (core::crc32c(payload.data(), payload.size()) != get<uint32_t>(bytes, 24))
        bad("document index CRC-32C mismatch (the file is damaged)");
    const uint64_t docs = get<uint64_t>(bytes, 32), tokens = get<uint64_t>(bytes, 40);
    if (docs * kRecordBytes != payload_bytes)
        bad(fmt::format("document index says {} documents but holds {} bytes of records", docs, payload_bytes));
    int64_t pos = first;
    for (uint64_t i = 0; i < docs; ++i) {
        const uint64_t len = get<uint64_t>(payload, i * kRecordBytes);
        if (len == 0 || len > (uint64_t{1} << 40)) bad(fmt::format("document {} has length {}", i, len));
        out.starts.push_back(pos);
        out.lengths.push_back(static_cast<int64_t>(len));
        out.tagged.push_back((get<uint64_t>(payload, i * kRecordBytes + 8) & kDocFlagLong) ? 1 : 0);
        pos += static_cast<int64_t>(len);
    }
    if (static_cast<uint64_t>(pos - first) != tokens)
        bad(fmt::format("document lengths sum to {} tokens but the header says {}", pos - first, tokens));
    return pos - first;
}

DocIndex doc_index_build(const TokenSource& source, const std::vector<std::string>& paths, int32_t eot) {
    DocIndex index;
    std::vector<std::string> sidecars;
    for (const auto& p : paths) sidecars.push_back(doc_index_sidecar(p));
    std::vector<std::string> missing;
    for (const auto& s : sidecars) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(s, ec)) missing.push_back(s);
    }
    const bool all = !sidecars.empty() && missing.empty();
    if (!all && missing.size() < sidecars.size())
        fmt::print(stderr,
                   "moetrain: warning: no document index {} beside its token file, so the stream is scanned for the "
                   "EOT and the other files' long tags are not used; rebuild the data with `moetrain data` to keep "
                   "them\n",
                   fmt::join(missing, ", "));
    if (all) {
        int64_t pos = 0;
        for (const auto& s : sidecars) pos += doc_index_read(s, pos, index);
        if (pos != source.num_tokens())
            core::fail_hint(ExitCode::data,
                            kRebuildHint,
                            "the document indexes cover {} tokens but the token files hold {} [{}]",
                            pos,
                            source.num_tokens(),
                            fmt::join(sidecars, ", "));
        return index;
    }
    // One pass over the stream in blocks: a document ends after each EOT.
    constexpr int64_t kBlock = int64_t{1} << 20;
    std::vector<int32_t> buf;
    int64_t start = 0;
    for (int64_t at = 0; at < source.num_tokens(); at += kBlock) {
        const int64_t n = std::min(kBlock, source.num_tokens() - at);
        buf.resize(static_cast<size_t>(n));
        source.read(at, n, buf.data());
        for (int64_t i = 0; i < n; ++i) {
            if (buf[static_cast<size_t>(i)] != eot) continue;
            index.starts.push_back(start);
            index.lengths.push_back(at + i + 1 - start);
            index.tagged.push_back(0);
            start = at + i + 1;
        }
    }
    if (start < source.num_tokens()) {
        index.starts.push_back(start);
        index.lengths.push_back(source.num_tokens() - start);
        index.tagged.push_back(0);
    }
    return index;
}

}  // namespace mt::data
