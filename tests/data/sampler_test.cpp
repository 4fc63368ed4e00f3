// Sampler: determinism, seeds, epoch coverage, call-order independence and the window/target layout.
#include "data/sampler.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "data/llmc_shard.h"
#include "data/token_source.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::DType;
using core::Tensor;
using testing::ScratchDir;

// A source whose token i is i % vocab, so a window's first token identifies it.
std::unique_ptr<TokenSource> make_source(const ScratchDir& dir, int n, int vocab = 65536) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = i % vocab;
    llmc_write_shard(dir.file("s.bin"), t, vocab);
    return token_source_open("llmc", {dir.file("s.bin")}, vocab);
}

TEST(DataSampler, PermutationIsBijective) {
    for (const int64_t n : {1, 2, 3, 5, 16, 17, 100, 1023, 4097}) {
        for (const uint64_t epoch : {0u, 1u, 7u}) {
            std::vector<int> seen(static_cast<size_t>(n), 0);
            for (int64_t i = 0; i < n; ++i) ++seen[static_cast<size_t>(sampler_permute(i, n, 42, epoch))];
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << n << " " << epoch;
        }
    }
}

TEST(DataSampler, WindowsAndTargets) {
    ScratchDir dir;
    auto src = make_source(dir, 1001);
    Sampler s(*src, 10, 7);
    EXPECT_EQ(s.num_windows(), 100);
    Tensor in = Tensor::zeros({4, 10}, DType::i32), tg = Tensor::zeros({4, 10}, DType::i32);
    s.fill(5, 4, in, tg);
    for (int64_t r = 0; r < 4; ++r) {
        const int64_t w = s.window_of(5 + r);
        for (int64_t c = 0; c < 10; ++c) {
            EXPECT_EQ(in.data<int32_t>()[r * 10 + c], w * 10 + c);
            EXPECT_EQ(tg.data<int32_t>()[r * 10 + c], w * 10 + c + 1);
        }
    }
    s.fill_sequential(98, 4, in, tg);
    const int64_t expect_windows[] = {98, 99, 0, 1};
    for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(in.data<int32_t>()[r * 10], expect_windows[r] * 10);
}

TEST(DataSampler, DeterministicAndSeedDependent) {
    ScratchDir dir;
    auto src = make_source(dir, 5000);
    Sampler a(*src, 16, 1234), b(*src, 16, 1234), c(*src, 16, 99);
    Tensor ia = Tensor::zeros({8, 16}, DType::i32), ta = Tensor::zeros({8, 16}, DType::i32);
    Tensor ib = Tensor::zeros({8, 16}, DType::i32), tb = Tensor::zeros({8, 16}, DType::i32);
    Tensor ic = Tensor::zeros({8, 16}, DType::i32), tc = Tensor::zeros({8, 16}, DType::i32);
    a.fill(100, 8, ia, ta);
    b.fill(100, 8, ib, tb);
    c.fill(100, 8, ic, tc);
    EXPECT_EQ(std::memcmp(ia.raw(), ib.raw(), ia.nbytes()), 0);
    EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0);
    EXPECT_NE(std::memcmp(ia.raw(), ic.raw(), ia.nbytes()), 0);
    a.fill(100, 8, ib, tb);  // again, same sampler
    EXPECT_EQ(std::memcmp(ia.raw(), ib.raw(), ia.nbytes()), 0);
}

TEST(DataSampler, EveryWindowOncePerEpochAndEpochsDiffer) {
    ScratchDir dir;
    auto src = make_source(dir, 3 * 37 + 1);
    Sampler s(*src, 3, 5);
    const int64_t n = s.num_windows();
    ASSERT_EQ(n, 37);
    std::vector<int64_t> epoch0, epoch1;
    for (int64_t g = 0; g < n; ++g) epoch0.push_back(s.window_of(g));
    for (int64_t g = n; g < 2 * n; ++g) epoch1.push_back(s.window_of(g));
    EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), static_cast<size_t>(n));
    EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), static_cast<size_t>(n));
    EXPECT_NE(epoch0, epoch1);
    std::vector<int64_t> identity(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
    EXPECT_NE(epoch0, identity);
}

TEST(DataSampler, IndependentOfCallOrder) {
    ScratchDir dir;
    auto src = make_source(dir, 2000);
    Sampler s(*src, 7, 11);
    const int64_t total = 3 * s.num_windows();
    std::vector<int64_t> forward(static_cast<size_t>(total)), backward(static_cast<size_t>(total));
    for (int64_t g = 0; g < total; ++g) forward[static_cast<size_t>(g)] = s.window_of(g);
    for (int64_t g = total - 1; g >= 0; --g) backward[static_cast<size_t>(g)] = s.window_of(g);
    EXPECT_EQ(forward, backward);
    // Batches filled out of order (as after a resume) match one big batch.
    Tensor big_in = Tensor::zeros({12, 7}, DType::i32), big_tg = Tensor::zeros({12, 7}, DType::i32);
    s.fill(280, 12, big_in, big_tg);
    Tensor in = Tensor::zeros({4, 7}, DType::i32), tg = Tensor::zeros({4, 7}, DType::i32);
    for (const int64_t part : {2, 0, 1}) {
        s.fill(280 + 4 * part, 4, in, tg);
        EXPECT_EQ(std::memcmp(in.raw(), big_in.data<int32_t>() + part * 28, in.nbytes()), 0);
        EXPECT_EQ(std::memcmp(tg.raw(), big_tg.data<int32_t>() + part * 28, tg.nbytes()), 0);
    }
}

TEST(DataSampler, FirstSampleFormula) {
    // step 3, grad_accum 2, micro 1, world 4, rank 2, batch 8: ((3*2+1)*4+2)*8
    EXPECT_EQ(sampler_first_sample(3, 2, 1, 4, 2, 8), 240);
    EXPECT_EQ(sampler_first_sample(0, 1, 0, 1, 0, 5), 0);
    EXPECT_EQ(sampler_first_sample(1, 1, 0, 1, 0, 5), 5);
}

TEST(DataSampler, TooFewTokens) {
    ScratchDir dir;
    auto src = make_source(dir, 10);
    testing::expect_error([&] { Sampler s(*src, 10, 1); }, core::ExitCode::data, {"10 tokens", "seq_len 10", "11"});
    Sampler ok(*src, 9, 1);
    EXPECT_EQ(ok.num_windows(), 1);
    EXPECT_EQ(ok.window_of(5), 0);
}

}  // namespace
}  // namespace mt::data
