// Reader and writer of Megatron indexed datasets; every header field and size is checked before use.
#include "data/megatron_dataset.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace mt::data {

using core::ExitCode;

namespace {

constexpr uint8_t kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr size_t kHeaderBytes = 34;
constexpr const char* kReindexHint =
    "the index is corrupt or truncated; re-run Megatron's preprocess_data.py "
    "(or `moetrain data --format megatron`) for this prefix.";

template <typename T>
T load(const uint8_t* p) {
    T x;
    std::memcpy(&x, p, sizeof(T));
    return x;
}

template <typename T>
void append(std::vector<uint8_t>& out, T x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    out.insert(out.end(), p, p + sizeof(T));
}

// Maps a Megatron dtype code to the token element type; float codes are not token types.
bool token_type_of(uint8_t code, TokenType* out) {
    switch (code) {
        case 1:
            *out = TokenType::u8;
            return true;
        case 2:
            *out = TokenType::i8;
            return true;
        case 3:
            *out = TokenType::i16;
            return true;
        case 4:
            *out = TokenType::i32;
            return true;
        case 5:
            *out = TokenType::i64;
            return true;
        case 8:
            *out = TokenType::u16;
            return true;
        default:
            return false;
    }
}

std::string strip_extension(const std::string& path) {
    const auto ends = [&](const char* ext) { return path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0; };
    return ends(".bin") || ends(".idx") ? path.substr(0, path.size() - 4) : path;
}

}  // namespace

MegatronDType megatron_dtype_for_vocab(int64_t vocab_size) {
    return vocab_size <= 65536 ? MegatronDType::u16 : MegatronDType::i32;
}

void megatron_write_dataset(const std::string& prefix,
                            std::span<const int32_t> tokens,
                            std::span<const int64_t> sequence_lengths,
                            MegatronDType dtype) {
    TokenType type;
    MT_CHECK(token_type_of(static_cast<uint8_t>(dtype), &type),
             "megatron dtype {} is not an integer type",
             static_cast<int>(dtype));
    const size_t width = token_type_size(type);
    int64_t lo = 0, hi = 0;
    switch (type) {
        case TokenType::u8:
            hi = 255;
            break;
        case TokenType::i8:
            lo = -128, hi = 127;
            break;
        case TokenType::i16:
            lo = -32768, hi = 32767;
            break;
        case TokenType::u16:
            hi = 65535;
            break;
        default:
            lo = INT32_MIN, hi = INT32_MAX;
    }
    std::vector<uint8_t> bin(tokens.size() * width);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const int64_t t = tokens[i];
        if (t < lo || t > hi)
            core::fail(ExitCode::data,
                       "token {} at index {} does not fit the {} dtype [{}.bin]",
                       t,
                       i,
                       token_type_name(type),
                       prefix);
        std::memcpy(&bin[i * width], &t, width);  // little-endian: the low bytes are the value
    }
    const uint64_t s = sequence_lengths.size();
    std::vector<uint8_t> idx(kMagic, kMagic + 9);
    append<uint64_t>(idx, 1);
    append<uint8_t>(idx, static_cast<uint8_t>(dtype));
    append<uint64_t>(idx, s);
    append<uint64_t>(idx, s + 1);
    int64_t total = 0;
    for (const int64_t len : sequence_lengths) {
        MT_CHECK(len >= 0 && len <= INT32_MAX, "sequence length {} out of range", len);
        append<int32_t>(idx, static_cast<int32_t>(len));
        total += len;
    }
    MT_CHECK(total == static_cast<int64_t>(tokens.size()),
             "sequence lengths sum to {} but there are {} tokens",
             total,
             tokens.size());
    int64_t pointer = 0;
    for (const int64_t len : sequence_lengths) {
        append<int64_t>(idx, pointer);
        pointer += len * static_cast<int64_t>(width);
    }
    for (uint64_t d = 0; d <= s; ++d) append<int64_t>(idx, static_cast<int64_t>(d));
    core::AtomicFileWriter bin_file(prefix + ".bin", core::ExitCode::data);
    bin_file.write(bin.data(), bin.size());
    bin_file.commit();
    core::AtomicFileWriter idx_file(prefix + ".idx", core::ExitCode::data);
    idx_file.write(idx.data(), idx.size());
    idx_file.commit();
}

MegatronDataset::MegatronDataset(const std::string& path) : prefix_(strip_extension(path)) {
    const std::string ipath = idx_path();
    idx_ = std::make_unique<core::MappedFile>(ipath, core::ExitCode::data);
    const uint8_t* p = idx_->data();
    const size_t size = idx_->size();
    if (size < kHeaderBytes)
        core::fail_hint(
            ExitCode::data, kReindexHint, "index file holds {} bytes, less than the 34-byte header [{}]", size, ipath);
    if (std::memcmp(p, kMagic, 9) != 0)
        core::fail_hint(ExitCode::data,
                        "this is not a Megatron .idx file; for llm.c shards set data.format = \"llmc\".",
                        "bad Megatron index magic (expected \"MMIDIDX\\0\\0\") [{}]",
                        ipath);
    const uint64_t version = load<uint64_t>(p + 9);
    if (version != 1)
        core::fail_hint(ExitCode::data,
                        "moetrain reads Megatron index version 1; re-run preprocess_data.py.",
                        "unsupported Megatron index version {} (expected 1) [{}]",
                        version,
                        ipath);
    const uint8_t code = p[17];
    TokenType type;
    if (!token_type_of(code, &type))
        core::fail_hint(ExitCode::data,
                        "token data must use an integer dtype (codes 1-5 or 8).",
                        "Megatron index dtype code {} is not an integer token type [{}]",
                        code,
                        ipath);
    dtype_ = static_cast<MegatronDType>(code);
    const uint64_t s = load<uint64_t>(p + 18);
    const uint64_t d = load<uint64_t>(p + 26);
    if (s > (uint64_t{1} << 48) || d > (uint64_t{1} << 48) || d < 1)
        core::fail_hint(ExitCode::data,
                        kReindexHint,
                        "Megatron index header has {} sequences and {} document indices [{}]",
                        s,
                        d,
                        ipath);
    const uint64_t expected = kHeaderBytes + 12 * s + 8 * d;
    if (size != expected && size != expected + s)
        core::fail_hint(ExitCode::data,
                        kReindexHint,
                        "Megatron index size is {} bytes but its header ({} sequences, {} document indices) needs {} "
                        "(or {} with sequence modes) [{}]",
                        size,
                        s,
                        d,
                        expected,
                        expected + s,
                        ipath);
    num_sequences_ = static_cast<int64_t>(s);
    num_documents_ = static_cast<int64_t>(d) - 1;
    lengths_off_ = kHeaderBytes;
    pointers_off_ = kHeaderBytes + 4 * s;
    docs_off_ = kHeaderBytes + 12 * s;
    if (document_index(0) != 0 || document_index(num_documents_) != num_sequences_)
        core::fail_hint(
            ExitCode::data,
            kReindexHint,
            "Megatron document indices must start at 0 and end at the sequence count {} (found {} .. {}) [{}]",
            s,
            document_index(0),
            document_index(num_documents_),
            ipath);
    for (int64_t i = 1; i <= num_documents_; ++i)
        if (document_index(i) < document_index(i - 1))
            core::fail_hint(
                ExitCode::data, kReindexHint, "Megatron document indices decrease at document {} [{}]", i, ipath);
    const int64_t width = static_cast<int64_t>(token_type_size(type));
    int64_t end = 0;
    for (int64_t i = 0; i < num_sequences_; ++i) {
        const int64_t len = sequence_length(i);
        if (len < 0 || sequence_pointer(i) != end)
            core::fail_hint(ExitCode::data,
                            kReindexHint,
                            "Megatron sequence {} has length {} and pointer {} (expected pointer {}) [{}]",
                            i,
                            len,
                            sequence_pointer(i),
                            end,
                            ipath);
        end += len * width;
    }
    const std::string bpath = bin_path();
    bin_ = std::make_unique<core::MappedFile>(bpath, core::ExitCode::data);
    if (static_cast<int64_t>(bin_->size()) != end)
        core::fail_hint(ExitCode::data,
                        bin_->size() < static_cast<size_t>(end)
                            ? "the .bin is truncated; re-run the preprocessing."
                            : "the .bin does not match its .idx; re-run the preprocessing.",
                        "Megatron index says {} tokens ({} bytes) but the data file holds {} bytes [{}]",
                        end / width,
                        end,
                        bin_->size(),
                        bpath);
    view_.data = bin_->data();
    view_.count = end / width;
    view_.type = type;
}

int64_t MegatronDataset::sequence_length(int64_t i) const {
    return load<int32_t>(idx_->data() + lengths_off_ + 4 * static_cast<size_t>(i));
}

int64_t MegatronDataset::sequence_pointer(int64_t i) const {
    return load<int64_t>(idx_->data() + pointers_off_ + 8 * static_cast<size_t>(i));
}

int64_t MegatronDataset::document_index(int64_t d) const {
    return load<int64_t>(idx_->data() + docs_off_ + 8 * static_cast<size_t>(d));
}

int64_t MegatronDataset::sequence_of_token(int64_t t) const {
    const int64_t byte = t * static_cast<int64_t>(token_type_size(view_.type));
    int64_t lo = 0, hi = num_sequences_;  // last i with pointer(i) <= byte
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (sequence_pointer(mid) <= byte)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

}  // namespace mt::data
