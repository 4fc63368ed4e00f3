// llm.c shard writer/reader: round trips for both token widths and every validation failure.
#include "data/llmc_shard.h"

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

TEST(DataLlmc, RoundTripUint16) {
    ScratchDir dir;
    const std::vector<int32_t> tokens = {0, 1, 256, 65535, 42, 7};
    llmc_write_shard(dir.file("a.bin"), tokens, 65536);
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.bin.tmp")));
    const auto bytes = read_all(dir.file("a.bin"));
    ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
    int32_t h[3];
    std::memcpy(h, bytes.data(), 12);
    EXPECT_EQ(h[0], 20240520);
    EXPECT_EQ(h[1], 1);
    EXPECT_EQ(h[2], 6);
    LlmcShard shard(dir.file("a.bin"));
    EXPECT_EQ(shard.num_tokens(), 6);
    EXPECT_EQ(shard.token_bytes(), 2);
    for (size_t i = 0; i < tokens.size(); ++i)
        EXPECT_EQ(token_view_get(shard.tokens(), static_cast<int64_t>(i)), tokens[i]);
}

TEST(DataLlmc, RoundTripUint32) {
    ScratchDir dir;
    const std::vector<int32_t> tokens = {0, 65536, 128255, 3};
    llmc_write_shard(dir.file("b.bin"), tokens, 128256);
    const auto bytes = read_all(dir.file("b.bin"));
    ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
    int32_t h[2];
    std::memcpy(h, bytes.data(), 8);
    EXPECT_EQ(h[0], 20240801);
    EXPECT_EQ(h[1], 7);
    LlmcShard shard(dir.file("b.bin"));
    EXPECT_EQ(shard.token_bytes(), 4);
    ASSERT_EQ(shard.num_tokens(), 4);
    for (size_t i = 0; i < tokens.size(); ++i)
        EXPECT_EQ(token_view_get(shard.tokens(), static_cast<int64_t>(i)), tokens[i]);
}

TEST(DataLlmc, EmptyShardRoundTrip) {
    ScratchDir dir;
    llmc_write_shard(dir.file("e.bin"), {}, 257);
    EXPECT_EQ(LlmcShard(dir.file("e.bin")).num_tokens(), 0);
}

TEST(DataLlmc, WriterRejectsTokenOutsideVocab) {
    ScratchDir dir;
    const std::vector<int32_t> tokens = {1, 300};
    expect_error([&] { llmc_write_shard(dir.file("x.bin"), tokens, 257); }, core::ExitCode::data, {"x.bin", "300"});
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin")));
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.bin.tmp")));
}

TEST(DataLlmc, MissingFile) {
    ScratchDir dir;
    expect_error([&] { LlmcShard s(dir.file("nope.bin")); }, core::ExitCode::data, {"nope.bin", "not found"});
}

TEST(DataLlmc, TruncatedShard) {
    ScratchDir dir;
    const std::string path = dir.file("train_000.bin");
    llmc_write_shard(path, std::vector<int32_t>(1000, 5), 50257);
    auto bytes = read_all(path);
    bytes.resize(bytes.size() - 4);
    write_all(path, bytes);
    try {
        LlmcShard s(path);
        FAIL() << "expected an error";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::data);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("shard header says 1000 tokens but the file holds 998"), std::string::npos) << msg;
        EXPECT_NE(msg.find("3024"), std::string::npos) << msg;  // expected bytes
        EXPECT_NE(msg.find("3020"), std::string::npos) << msg;  // actual bytes
        EXPECT_NE(msg.find("[" + path + "]"), std::string::npos) << msg;
        EXPECT_NE(e.hint().find("truncated"), std::string::npos) << e.hint();
    }
}

TEST(DataLlmc, TrailingBytes) {
    ScratchDir dir;
    const std::string path = dir.file("long.bin");
    llmc_write_shard(path, std::vector<int32_t>(10, 5), 257);
    auto bytes = read_all(path);
    bytes.push_back(0);
    write_all(path, bytes);
    expect_error([&] { LlmcShard s(path); }, core::ExitCode::data, {"long.bin", "10 tokens"});
}

TEST(DataLlmc, ShorterThanHeader) {
    ScratchDir dir;
    testing::write_text(dir.file("tiny.bin"), "abc");
    expect_error([&] { LlmcShard s(dir.file("tiny.bin")); }, core::ExitCode::data, {"tiny.bin", "1024"});
}

TEST(DataLlmc, BadMagic) {
    ScratchDir dir;
    const std::string path = dir.file("magic.bin");
    llmc_write_shard(path, std::vector<int32_t>(4, 1), 257);
    auto bytes = read_all(path);
    const int32_t bad = 12345;
    std::memcpy(bytes.data(), &bad, 4);
    write_all(path, bytes);
    expect_error([&] { LlmcShard s(path); }, core::ExitCode::data, {"magic.bin", "12345", "magic"});
}

TEST(DataLlmc, WrongVersion) {
    ScratchDir dir;
    for (const int64_t vocab : {257, 100000}) {
        const std::string path = dir.file("version.bin");
        llmc_write_shard(path, std::vector<int32_t>(4, 1), vocab);
        auto bytes = read_all(path);
        const int32_t bad = 3;
        std::memcpy(bytes.data() + 4, &bad, 4);
        write_all(path, bytes);
        expect_error([&] { LlmcShard s(path); }, core::ExitCode::data, {"version.bin", "version 3"});
    }
}

TEST(DataLlmc, NegativeCount) {
    ScratchDir dir;
    const std::string path = dir.file("neg.bin");
    llmc_write_shard(path, std::vector<int32_t>(4, 1), 257);
    auto bytes = read_all(path);
    const int32_t bad = -4;
    std::memcpy(bytes.data() + 8, &bad, 4);
    write_all(path, bytes);
    expect_error([&] { LlmcShard s(path); }, core::ExitCode::data, {"neg.bin", "-4"});
}

}  // namespace
}  // namespace mt::data
