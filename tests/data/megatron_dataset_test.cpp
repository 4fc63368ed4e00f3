// Megatron indexed dataset writer/reader: round trips for several dtypes and the .idx/.bin validation.
#include "data/megatron_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <vector>

#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::expect_error;
using testing::ScratchDir;

std::vector<char> read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

const std::vector<int32_t> kTokens = {5, 6, 7, 100, 1, 2, 3, 4, 9};
const std::vector<int64_t> kLengths = {3, 0, 2, 4};

void check_round_trip(const std::string& prefix, MegatronDType dtype) {
    megatron_write_dataset(prefix, kTokens, kLengths, dtype);
    MegatronDataset ds(prefix + ".idx");  // PREFIX, PREFIX.bin and PREFIX.idx all work
    EXPECT_EQ(ds.prefix(), prefix);
    EXPECT_EQ(ds.dtype(), dtype);
    EXPECT_EQ(ds.num_sequences(), 4);
    EXPECT_EQ(ds.num_documents(), 4);
    ASSERT_EQ(ds.num_tokens(), 9);
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(token_view_get(ds.tokens(), i), kTokens[i]);
    const int64_t w = static_cast<int64_t>(token_type_size(ds.tokens().type));
    int64_t pointer = 0;
    for (int64_t s = 0; s < 4; ++s) {
        EXPECT_EQ(ds.sequence_length(s), kLengths[s]);
        EXPECT_EQ(ds.sequence_pointer(s), pointer);
        pointer += kLengths[s] * w;
    }
    for (int64_t d = 0; d <= 4; ++d) EXPECT_EQ(ds.document_index(d), d);
    EXPECT_EQ(ds.sequence_of_token(0), 0);
    EXPECT_EQ(ds.sequence_of_token(2), 0);
    EXPECT_EQ(ds.sequence_of_token(3), 2);
    EXPECT_EQ(ds.sequence_of_token(4), 2);
    EXPECT_EQ(ds.sequence_of_token(5), 3);
    EXPECT_EQ(ds.sequence_of_token(8), 3);
}

TEST(DataMegatron, RoundTripAllIntegerDtypes) {
    ScratchDir dir;
    for (const auto dtype : {MegatronDType::u16,
                             MegatronDType::i32,
                             MegatronDType::u8,
                             MegatronDType::i64,
                             MegatronDType::i16,
                             MegatronDType::i8}) {
        SCOPED_TRACE(static_cast<int>(dtype));
        check_round_trip(dir.file("ds" + std::to_string(static_cast<int>(dtype))), dtype);
    }
}

TEST(DataMegatron, IdxLayoutMatchesSpec) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("x"), kTokens, kLengths, MegatronDType::u16);
    const auto idx = read_all(dir.file("x.idx"));
    ASSERT_EQ(idx.size(), 34u + 12 * 4 + 8 * 5);
    EXPECT_EQ(std::memcmp(idx.data(), "MMIDIDX\0\0", 9), 0);
    uint64_t version, s, d;
    std::memcpy(&version, idx.data() + 9, 8);
    std::memcpy(&s, idx.data() + 18, 8);
    std::memcpy(&d, idx.data() + 26, 8);
    EXPECT_EQ(version, 1u);
    EXPECT_EQ(idx[17], 8);
    EXPECT_EQ(s, 4u);
    EXPECT_EQ(d, 5u);
    EXPECT_EQ(read_all(dir.file("x.bin")).size(), 18u);
    EXPECT_EQ(megatron_dtype_for_vocab(65536), MegatronDType::u16);
    EXPECT_EQ(megatron_dtype_for_vocab(65537), MegatronDType::i32);
}

TEST(DataMegatron, AcceptsSequenceModes) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("m"), kTokens, kLengths, MegatronDType::u16);
    auto idx = read_all(dir.file("m.idx"));
    idx.insert(idx.end(), 4, 0);
    write_all(dir.file("m.idx"), idx);
    EXPECT_EQ(MegatronDataset(dir.file("m")).num_tokens(), 9);
}

TEST(DataMegatron, MissingFiles) {
    ScratchDir dir;
    expect_error([&] { MegatronDataset d(dir.file("none")); }, core::ExitCode::data, {"none.idx"});
    megatron_write_dataset(dir.file("nobin"), kTokens, kLengths, MegatronDType::u16);
    std::filesystem::remove(dir.file("nobin.bin"));
    expect_error([&] { MegatronDataset d(dir.file("nobin")); }, core::ExitCode::data, {"nobin.bin"});
}

TEST(DataMegatron, BadMagic) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("bm"), kTokens, kLengths, MegatronDType::u16);
    auto idx = read_all(dir.file("bm.idx"));
    idx[0] = 'X';
    write_all(dir.file("bm.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("bm")); }, core::ExitCode::data, {"bm.idx", "magic"});
}

TEST(DataMegatron, WrongVersion) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("v"), kTokens, kLengths, MegatronDType::u16);
    auto idx = read_all(dir.file("v.idx"));
    idx[9] = 2;
    write_all(dir.file("v.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("v")); }, core::ExitCode::data, {"v.idx", "version 2"});
}

TEST(DataMegatron, FloatDtypeRejected) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("f"), kTokens, kLengths, MegatronDType::i32);
    auto idx = read_all(dir.file("f.idx"));
    idx[17] = 7;
    write_all(dir.file("f.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("f")); }, core::ExitCode::data, {"f.idx", "dtype code 7"});
}

TEST(DataMegatron, WrongIdxSize) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("sz"), kTokens, kLengths, MegatronDType::u16);
    auto idx = read_all(dir.file("sz.idx"));
    idx.pop_back();
    write_all(dir.file("sz.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("sz")); }, core::ExitCode::data, {"sz.idx", "121"});
    idx.resize(20);
    write_all(dir.file("sz.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("sz")); }, core::ExitCode::data, {"sz.idx", "34-byte"});
}

TEST(DataMegatron, TruncatedBin) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("tb"), kTokens, kLengths, MegatronDType::u16);
    auto bin = read_all(dir.file("tb.bin"));
    bin.resize(bin.size() - 2);
    write_all(dir.file("tb.bin"), bin);
    expect_error([&] { MegatronDataset d(dir.file("tb")); }, core::ExitCode::data, {"tb.bin", "18 bytes", "16"});
}

TEST(DataMegatron, BadPointersAndDocuments) {
    ScratchDir dir;
    megatron_write_dataset(dir.file("p"), kTokens, kLengths, MegatronDType::u16);
    const auto good = read_all(dir.file("p.idx"));
    auto idx = good;
    const int64_t bad_pointer = 2;
    std::memcpy(idx.data() + 34 + 16 + 8 * 2, &bad_pointer, 8);  // sequence 2 should start at byte 6
    write_all(dir.file("p.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("p")); }, core::ExitCode::data, {"p.idx", "sequence 2"});
    idx = good;
    const int64_t bad_last_doc = 3;
    std::memcpy(idx.data() + 34 + 48 + 8 * 4, &bad_last_doc, 8);
    write_all(dir.file("p.idx"), idx);
    expect_error([&] { MegatronDataset d(dir.file("p")); }, core::ExitCode::data, {"p.idx", "document"});
}

TEST(DataMegatron, WriterRejectsTokensOutsideDtype) {
    ScratchDir dir;
    const std::vector<int32_t> tokens = {1, 300};
    const std::vector<int64_t> lengths = {2};
    expect_error([&] { megatron_write_dataset(dir.file("w"), tokens, lengths, MegatronDType::u8); },
                 core::ExitCode::data,
                 {"w.bin", "300"});
}

}  // namespace
}  // namespace mt::data
