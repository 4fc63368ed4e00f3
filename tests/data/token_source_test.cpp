// TokenSource: concatenation across files of both formats, reads that span files, and vocab checks.
#include "data/token_source.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "data/llmc_shard.h"
#include "data/megatron_dataset.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::expect_error;
using testing::ScratchDir;

std::vector<int32_t> iota_tokens(int n, int start, int mod) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (start + i) % mod;
    return t;
}

TEST(DataTokenSource, LlmcConcatenatesFiles) {
    ScratchDir dir;
    const auto a = iota_tokens(10, 0, 257), b = iota_tokens(7, 100, 257), c = iota_tokens(5, 200, 257);
    llmc_write_shard(dir.file("a.bin"), a, 257);
    llmc_write_shard(dir.file("b.bin"), b, 257);
    llmc_write_shard(dir.file("c.bin"), c, 257);
    auto src = token_source_open("llmc", {dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin")}, 257);
    ASSERT_EQ(src->num_tokens(), 22);
    std::vector<int32_t> all = a;
    all.insert(all.end(), b.begin(), b.end());
    all.insert(all.end(), c.begin(), c.end());
    for (int64_t start = 0; start < 22; ++start)
        for (int64_t count = 0; start + count <= 22; ++count) {
            std::vector<int32_t> out(static_cast<size_t>(count));
            src->read(start, count, out.data());
            for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[i], all[start + i]) << start << " " << count;
        }
}

TEST(DataTokenSource, MegatronWideTokens) {
    ScratchDir dir;
    const auto a = iota_tokens(12, 70000, 100000);
    const std::vector<int64_t> lengths = {5, 7};
    megatron_write_dataset(dir.file("m"), a, lengths, megatron_dtype_for_vocab(100000));
    auto src = token_source_open("megatron", {dir.file("m.bin")}, 100000);
    std::vector<int32_t> out(12);
    src->read(0, 12, out.data());
    EXPECT_EQ(out, a);
    EXPECT_NE(src->describe().find("megatron"), std::string::npos);
}

TEST(DataTokenSource, TokenOutsideVocabNamesFileAndIndex) {
    ScratchDir dir;
    llmc_write_shard(dir.file("ok.bin"), iota_tokens(10, 0, 100), 65536);
    auto bad = iota_tokens(10, 0, 100);
    bad[6] = 5000;
    llmc_write_shard(dir.file("bad.bin"), bad, 65536);
    auto src = token_source_open("llmc", {dir.file("ok.bin"), dir.file("bad.bin")}, 1000);
    std::vector<int32_t> out(20);
    src->read(0, 16, out.data());  // stops before the bad token
    expect_error([&] { src->read(10, 10, out.data()); }, core::ExitCode::data, {"bad.bin", "token 6", "5000", "1000"});
}

TEST(DataTokenSource, MegatronBadTokenNamesSequence) {
    ScratchDir dir;
    auto t = iota_tokens(10, 0, 50);
    t[7] = 60;
    const std::vector<int64_t> lengths = {3, 3, 4};
    megatron_write_dataset(dir.file("s"), t, lengths, MegatronDType::u16);
    auto src = token_source_open("megatron", {dir.file("s")}, 50);
    std::vector<int32_t> out(10);
    expect_error([&] { src->read(0, 10, out.data()); }, core::ExitCode::data, {"s.bin", "token 7", "sequence 2", "60"});
}

TEST(DataTokenSource, OpenErrors) {
    ScratchDir dir;
    expect_error([&] { token_source_open("llmc", {}, 257); }, core::ExitCode::usage, {"no llmc token files"});
    expect_error([&] { token_source_open("parquet", {"x"}, 257); }, core::ExitCode::usage, {"parquet"});
    expect_error(
        [&] { token_source_open("llmc", {dir.file("missing.bin")}, 257); }, core::ExitCode::data, {"missing.bin"});
    llmc_write_shard(dir.file("empty.bin"), {}, 257);
    expect_error([&] { token_source_open("llmc", {dir.file("empty.bin")}, 257); },
                 core::ExitCode::data,
                 {"empty.bin", "no tokens"});
}

}  // namespace
}  // namespace mt::data
