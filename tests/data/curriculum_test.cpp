// The curriculum sampler and the document index: the long share over 10,000 samples, long and replay rows built from
// the right documents, the stream a pure function of (seed, stage, index), the stage schedule, MTDOCS round trip and
// its damaged-file errors (long_context.md §10 test 7).
#include "data/curriculum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/rng.h"
#include "data/doc_index.h"
#include "data/llmc_shard.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::DType;
using core::Tensor;
using testing::ScratchDir;

constexpr int32_t kVocab = 100, kEot = 99;
// Token classes, so a row's tokens say where they came from without the sampler's help: a short document is
// [kShortStart, 2..48 ..., kEot], a long one [kLongStart, 51..97 ..., kEot].
constexpr int32_t kShortStart = 1, kLongStart = 50;

struct Corpus {
    std::vector<int64_t> lengths;
    std::vector<uint8_t> tagged;
    std::unique_ptr<TokenSource> source;
    DocIndex index;
};

// 600 short documents (3..30 tokens, below half of seq_len 64), 20 long ones (100..600 tokens, at least half of seq_len
// 64) and 5 of 20 tokens tagged long (so they count as long although they are short), shuffled together.
Corpus make_corpus(const ScratchDir& dir, bool with_sidecar = true) {
    Corpus c;
    std::vector<int32_t> tokens;
    std::vector<int> kinds;  // 0 short, 1 long, 2 tagged
    for (int i = 0; i < 600; ++i) kinds.push_back(0);
    for (int i = 0; i < 20; ++i) kinds.push_back(1);
    for (int i = 0; i < 5; ++i) kinds.push_back(2);
    for (size_t i = kinds.size() - 1; i > 0; --i) std::swap(kinds[i], kinds[core::rng_u64(3, 4, i) % (i + 1)]);
    for (size_t d = 0; d < kinds.size(); ++d) {
        const int kind = kinds[d];
        const int64_t len = kind == 0   ? 3 + static_cast<int64_t>(core::rng_u64(5, 6, d) % 28)
                            : kind == 1 ? 100 + static_cast<int64_t>(core::rng_u64(5, 7, d) % 501)
                                        : 20;
        const int32_t start = kind == 0 ? kShortStart : kLongStart;
        tokens.push_back(start);
        for (int64_t i = 1; i + 1 < len; ++i)
            tokens.push_back(start + 1 + static_cast<int32_t>(core::rng_u64(8, 9, tokens.size()) % 47));
        tokens.push_back(kEot);
        c.lengths.push_back(len);
        c.tagged.push_back(kind == 2 ? 1 : 0);
    }
    llmc_write_shard(dir.file("train.bin"), tokens, kVocab);
    if (with_sidecar) doc_index_write(dir.file("train.docs"), c.lengths, c.tagged);
    c.source = token_source_open("llmc", {dir.file("train.bin")}, kVocab);
    c.index = doc_index_build(*c.source, {dir.file("train.bin")}, kEot);
    return c;
}

bool long_token(int32_t t) {
    return t >= kLongStart && t < kEot;
}

TEST(DocIndex, SidecarRoundTripAndEotScanAgree) {
    ScratchDir dir;
    const Corpus c = make_corpus(dir);
    ASSERT_EQ(c.index.lengths, c.lengths);
    ASSERT_EQ(c.index.tagged, c.tagged);
    EXPECT_EQ(c.index.starts.front(), 0);
    EXPECT_EQ(c.index.starts.back() + c.index.lengths.back(), c.source->num_tokens());
    // Without the sidecar the same documents come from the EOT scan, none tagged.
    std::filesystem::remove(dir.file("train.docs"));
    const DocIndex scanned = doc_index_build(*c.source, {dir.file("train.bin")}, kEot);
    EXPECT_EQ(scanned.lengths, c.lengths);
    EXPECT_EQ(scanned.starts, c.index.starts);
    EXPECT_EQ(std::count(scanned.tagged.begin(), scanned.tagged.end(), 1), 0);
    EXPECT_EQ(doc_index_sidecar("a/train.bin"), "a/train.docs");
    // Two files of which only one has its index: the scan, and a warning naming the one without.
    llmc_write_shard(dir.file("more.bin"), std::vector<int32_t>{1, 2, kEot}, kVocab);
    doc_index_write(dir.file("more.docs"), {3}, {1});
    const auto both = token_source_open("llmc", {dir.file("train.bin"), dir.file("more.bin")}, kVocab);
    ::testing::internal::CaptureStderr();
    const DocIndex mixed = doc_index_build(*both, {dir.file("train.bin"), dir.file("more.bin")}, kEot);
    const std::string warning = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warning.find("no document index " + dir.file("train.docs")), std::string::npos) << warning;
    EXPECT_EQ(std::count(mixed.tagged.begin(), mixed.tagged.end(), 1), 0);
    EXPECT_EQ(mixed.lengths.back(), 3);
    EXPECT_EQ(doc_index_sidecar("a/train"), "a/train.docs");
}

TEST(DocIndex, DamagedSidecarsAreDataErrorsNamingTheFile) {
    ScratchDir dir;
    const std::string path = dir.file("x.docs");
    doc_index_write(path, {3, 4, 5}, {0, 1, 0});
    std::string good;
    {
        std::ifstream in(path, std::ios::binary);
        good.assign(std::istreambuf_iterator<char>(in), {});
    }
    ASSERT_EQ(good.size(), 64u + 3 * 16);
    auto write = [&](const std::string& bytes) {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << bytes;
    };
    auto read = [&] {
        DocIndex idx;
        doc_index_read(path, 0, idx);
    };
    write(good.substr(0, good.size() - 1));
    testing::expect_error(read, core::ExitCode::data, {"truncated", path});
    std::string bad_magic = good;
    bad_magic[0] = 'X';
    write(bad_magic);
    testing::expect_error(read, core::ExitCode::data, {"bad magic", path});
    std::string bad_version = good;
    bad_version[8] = 9;
    write(bad_version);
    testing::expect_error(read, core::ExitCode::data, {"version 9", path});
    std::string bad_crc = good;
    bad_crc[64] ^= 1;
    write(bad_crc);
    testing::expect_error(read, core::ExitCode::data, {"CRC-32C", path});
    write(good);
    DocIndex idx;
    EXPECT_EQ(doc_index_read(path, 10, idx), 12);
    EXPECT_EQ(idx.starts, (std::vector<int64_t>{10, 13, 17}));
    EXPECT_EQ(idx.tagged, (std::vector<uint8_t>{0, 1, 0}));
    // A sidecar that does not cover the token file is refused too.
    ScratchDir other;
    llmc_write_shard(other.file("t.bin"), std::vector<int32_t>(20, 1), kVocab);
    doc_index_write(other.file("t.docs"), {5, 5}, {0, 0});
    auto src = token_source_open("llmc", {other.file("t.bin")}, kVocab);
    testing::expect_error([&] { doc_index_build(*src, {other.file("t.bin")}, kEot); },
                          core::ExitCode::data,
                          {"cover 10 tokens but the token files hold 20", other.file("t.docs")});
}

// The rows of 10,000 samples: the long share, by the tokens themselves, within 1% of the target; long rows hold only
// long-document tokens and replay rows only short ones, each replay document from its start.
TEST(Curriculum, LongShareWithinOnePercentOver10000Samples) {
    ScratchDir dir;
    const Corpus c = make_corpus(dir);
    const int64_t seq = 64;
    for (const double target : {0.25, 0.1, 0.5}) {
        CurriculumSampler s(*c.source, c.index, 1, seq, target, 1234);
        EXPECT_EQ(s.num_long_documents(), 25);
        std::vector<int32_t> row(static_cast<size_t>(seq) + 1);
        std::vector<uint8_t> from_long(row.size());
        int64_t long_tokens = 0, long_rows = 0;
        const int64_t n = 10000;
        for (int64_t i = 0; i < n; ++i) {
            s.fill_row(i, row.data(), from_long.data());
            const bool is_long = s.is_long(i);
            long_rows += is_long;
            for (int64_t t = 0; t < seq; ++t) {
                const int32_t tok = row[static_cast<size_t>(t)];
                if (tok == kEot) continue;
                ASSERT_EQ(long_token(tok), is_long) << "sample " << i << " token " << t;
                long_tokens += long_token(tok);
                ASSERT_EQ(from_long[static_cast<size_t>(t)], is_long ? 1 : 0);
            }
            if (!is_long) {
                ASSERT_EQ(row[0], kShortStart) << "a replay row starts with a whole document";
                for (int64_t t = 0; t + 1 <= seq; ++t) {
                    const bool after_eot = row[static_cast<size_t>(t)] == kEot;
                    ASSERT_TRUE(!after_eot || row[static_cast<size_t>(t) + 1] == kShortStart) << "sample " << i;
                }
            }
        }
        const double row_share = static_cast<double>(long_rows) / n;
        EXPECT_NEAR(row_share, target, 0.01) << target;
        EXPECT_EQ(s.count_long(n), long_rows);
        EXPECT_EQ(s.long_tokens(0, n), long_rows * seq);
        // Tokens (EOTs aside) tell the same share: every long row is long tokens throughout.
        EXPECT_GT(long_tokens, 0);
        EXPECT_NEAR(static_cast<double>(s.long_tokens(0, n)) / static_cast<double>(n * seq), target, 0.01);
    }
    // The extremes: no long rows, all long rows.
    EXPECT_EQ(CurriculumSampler(*c.source, c.index, 0, seq, 0.0, 1).count_long(5000), 0);
    EXPECT_EQ(CurriculumSampler(*c.source, c.index, 0, seq, 1.0, 1).count_long(5000), 5000);
}

// Sample i of stage s is a pure function of (seed, s, i): batches in any order, a fresh sampler (a resumed run) and
// single rows give the same tokens; another stage or seed gives others.
TEST(Curriculum, StreamIsAPureFunctionOfSeedStageAndIndex) {
    ScratchDir dir;
    const Corpus c = make_corpus(dir);
    const int64_t seq = 48, n = 96;
    auto rows = [&](const CurriculumSampler& s, int64_t first, int64_t count) {
        Tensor in = Tensor::zeros({count, seq}, DType::i32), tg = Tensor::zeros({count, seq}, DType::i32);
        s.fill(first, count, in, tg);
        std::vector<int32_t> out(in.data<int32_t>(), in.data<int32_t>() + count * seq);
        for (int64_t r = 0; r < count; ++r)  // targets are the inputs shifted by one
            for (int64_t t = 0; t + 1 < seq; ++t)
                EXPECT_EQ(tg.data<int32_t>()[r * seq + t], in.data<int32_t>()[r * seq + t + 1]);
        return out;
    };
    const CurriculumSampler a(*c.source, c.index, 2, seq, 0.25, 77);
    const auto whole = rows(a, 0, n);
    // The second half from a new sampler, as a run resumed mid-stage reads it, then the first half: bitwise equal.
    const CurriculumSampler resumed(*c.source, c.index, 2, seq, 0.25, 77);
    auto second = rows(resumed, n / 2, n / 2);
    auto first = rows(resumed, 0, n / 2);
    first.insert(first.end(), second.begin(), second.end());
    EXPECT_EQ(first, whole);
    EXPECT_NE(rows(CurriculumSampler(*c.source, c.index, 3, seq, 0.25, 77), 0, n), whole);
    EXPECT_NE(rows(CurriculumSampler(*c.source, c.index, 2, seq, 0.25, 78), 0, n), whole);
}

// A stage without long_fraction is the natural mix: the Sampler's windows; its long tokens are counted from the index.
TEST(Curriculum, NaturalMixIsTheWindowedStreamAndCountsItsLongTokens) {
    ScratchDir dir;
    const Corpus c = make_corpus(dir);
    const int64_t seq = 64;
    const CurriculumSampler s(*c.source, c.index, 0, seq, -1.0, 5);
    const Sampler windows(*c.source, seq, 5);
    Tensor a = Tensor::zeros({8, seq}, DType::i32), at = Tensor::zeros({8, seq}, DType::i32);
    Tensor b = Tensor::zeros({8, seq}, DType::i32), bt = Tensor::zeros({8, seq}, DType::i32);
    s.fill(40, 8, a, at);
    windows.fill(40, 8, b, bt);
    EXPECT_EQ(std::memcmp(a.data<int32_t>(), b.data<int32_t>(), 8 * seq * 4), 0);
    std::vector<int32_t> row(static_cast<size_t>(seq) + 1);
    std::vector<uint8_t> from_long(row.size());
    int64_t counted = 0, by_tokens = 0;
    for (int64_t i = 0; i < 500; ++i) {
        s.fill_row(i, row.data(), from_long.data());
        for (int64_t t = 0; t < seq; ++t) {
            counted += from_long[static_cast<size_t>(t)];
            by_tokens += long_token(row[static_cast<size_t>(t)]) ||
                         (row[static_cast<size_t>(t)] == kEot && from_long[static_cast<size_t>(t)]);
        }
    }
    EXPECT_EQ(s.long_tokens(0, 500), counted);
    EXPECT_EQ(counted, by_tokens);
    EXPECT_GT(counted, 0);
    EXPECT_LT(counted, 500 * seq);
}

TEST(Curriculum, RefusesAStageWithoutLongDocumentsOrWithoutReplay) {
    ScratchDir dir;
    std::vector<int32_t> tokens;
    for (int d = 0; d < 50; ++d) tokens.insert(tokens.end(), {kShortStart, 2, 3, kEot});
    llmc_write_shard(dir.file("short.bin"), tokens, kVocab);
    auto src = token_source_open("llmc", {dir.file("short.bin")}, kVocab);
    const DocIndex idx = doc_index_build(*src, {dir.file("short.bin")}, kEot);
    testing::expect_error([&] { CurriculumSampler(*src, idx, 1, 64, 0.25, 1); },
                          core::ExitCode::data,
                          {"stage 1", "no long document", dir.file("short.bin")});
    EXPECT_NO_THROW(CurriculumSampler(*src, idx, 1, 64, 0.0, 1));
    // At seq_len 4 every document of 4 tokens is long: replay has nothing to draw.
    testing::expect_error(
        [&] { CurriculumSampler(*src, idx, 0, 4, 0.5, 1); }, core::ExitCode::data, {"every document", "is long"});
    EXPECT_NO_THROW(CurriculumSampler(*src, idx, 0, 4, 1.0, 1));
}

// Stages switch at the first step boundary at or after their token budget.
TEST(Curriculum, StagesSwitchAtTheConfiguredTokenCounts) {
    // 8 rows per step: stage 0 at 128 tokens is 1024 per step, 4096 tokens = 4 steps; stage 1 at 256 tokens is 2048
    // per step, 5000 tokens = 3 steps (2.44, rounded up); stage 2 runs on.
    const auto first = curriculum_first_steps({128, 256, 512}, {4096, 5000, 1}, 8);
    EXPECT_EQ(first, (std::vector<int64_t>{0, 4, 7}));
    const int64_t expect[] = {0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2};
    for (int64_t step = 0; step < 11; ++step) EXPECT_EQ(curriculum_stage_of_step(first, step), expect[step]) << step;
}

}  // namespace
}  // namespace mt::data
