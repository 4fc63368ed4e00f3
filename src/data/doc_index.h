// Document index of a token stream: where each document starts, its length and whether its source is tagged long.
// `moetrain data` writes it as a sidecar beside each token file (PREFIX.docs, an MTDOCS file, conventions §6); a token
// file without one is scanned for the EOT token instead. The curriculum (data/curriculum.h) draws from it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_source.h"

namespace mt::data {

// MTDOCS, version 1, little-endian: the 64-byte header of conventions §6 (magic "MTDOCS\0\0", u32 version, u32
// header_bytes = 64, u64 payload_bytes, u32 CRC-32C of the payload, u32 flags = 0), then at offset 32 u64 documents
// and u64 tokens (their sum), zeros to 64. Payload: per document 16 bytes, u64 length in tokens (its EOT included) and
// u64 flags (bit 0: the document comes from a source tagged long). Documents are in stream order, back to back.
constexpr uint32_t kDocIndexVersion = 1;
constexpr uint64_t kDocFlagLong = 1;

struct DocIndex {
    std::vector<int64_t> starts;   // first token of each document in the stream
    std::vector<int64_t> lengths;  // tokens of each document, the EOT that ends it included
    std::vector<uint8_t> tagged;   // 1: from a source tagged long

    int64_t size() const {
        return static_cast<int64_t>(lengths.size());
    }
};

// The sidecar of a token file: PATH less a .bin or .idx extension, plus ".docs" (train.bin -> train.docs; a Megatron
// prefix train -> train.docs).
std::string doc_index_sidecar(std::string_view token_path);

// Writes an MTDOCS file atomically (PATH.tmp, then renamed): exit 3 naming it when that fails.
// @param[in] path     the file
// @param[in] lengths  tokens per document, each >= 1
// @param[in] tagged   per document, 1 when tagged long (same size as lengths)
void doc_index_write(const std::string& path, const std::vector<int64_t>& lengths, const std::vector<uint8_t>& tagged);

// Reads an MTDOCS file; appends its documents to `out`, starting at stream position `first`. Checks, in order, the
// file size against the header, the magic, the version, the CRC and the token sum; each failure is exit 3 naming the
// file, with what to do.
// @param[in]  path   the file
// @param[in]  first  stream position of the token file's first token
// @param[out] out    documents appended
// @return the tokens the documents cover
int64_t doc_index_read(const std::string& path, int64_t first, DocIndex& out);

// The index of a whole token source. When every token file has its sidecar, they are read and must cover the stream
// exactly; otherwise the stream is scanned once for `eot` (a document ends after each EOT; the tail after the last one
// is a document too) and no document is tagged; when only some files have one, a warning on stderr names those
// without (their tags are lost, which the curriculum's long pool may miss).
// @param[in] source  the stream
// @param[in] paths   the token files, in stream order
// @param[in] eot     the end-of-document token
DocIndex doc_index_build(const TokenSource& source, const std::vector<std::string>& paths, int32_t eot);

}  // namespace mt::data
