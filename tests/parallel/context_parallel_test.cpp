// The zigzag layout of context parallelism (long_context.md §7, test 6's assignment test): which chunks each rank
// holds, the global position of every local token, who holds each chunk, the balance of causal work, and the row moves
// of a one-rank group; all in one process, without MPI.
#include "parallel/context_parallel.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "nn/context_parallel.h"
#include "parallel/comm.h"

using namespace mt::parallel;

TEST(Zigzag, RankRHoldsChunksRAnd2CpMinus1MinusR) {
    // cp = 4 over 16 tokens: chunks of 2; rank 0 holds chunks 0 and 7, rank 1 chunks 1 and 6, ...
    const int64_t cp = 4, seq = 16;
    const std::vector<std::vector<int64_t>> positions = {{0, 1, 14, 15}, {2, 3, 12, 13}, {4, 5, 10, 11}, {6, 7, 8, 9}};
    for (int64_t r = 0; r < cp; ++r) {
        const Zigzag z = zigzag(cp, r, seq);
        EXPECT_EQ(z.chunk(), 2);
        EXPECT_EQ(z.local(), 4);
        EXPECT_EQ(z.span_chunk(0), r);
        EXPECT_EQ(z.span_chunk(1), 2 * cp - 1 - r);
        for (int64_t i = 0; i < z.local(); ++i)
            EXPECT_EQ(z.position(i), positions[static_cast<size_t>(r)][static_cast<size_t>(i)]) << r << " " << i;
    }
}

TEST(Zigzag, EveryPositionHasOneOwnerAndCausalWorkIsBalanced) {
    for (int64_t cp : {1, 2, 3, 4, 8}) {
        const int64_t seq = cp_granularity(cp) * 3;
        EXPECT_EQ(seq % (2 * cp * kCpGranule), 0);
        std::set<int64_t> seen;
        double work0 = -1.0;
        for (int64_t r = 0; r < cp; ++r) {
            const Zigzag z = zigzag(cp, r, seq);
            EXPECT_EQ(z.chunk() % kCpGranule, 0);
            double work = 0.0;  // causal attention: query t sees t + 1 keys
            for (int64_t i = 0; i < z.local(); ++i) {
                const int64_t t = z.position(i);
                EXPECT_TRUE(seen.insert(t).second) << "position " << t << " held twice";
                work += static_cast<double>(t + 1);
                // The chunk of t is one of the rank's spans, and owner() names this rank and span.
                const ZigzagOwner o = z.owner(t / z.chunk());
                EXPECT_EQ(o.rank, r);
                EXPECT_EQ(z.span_first(o.span), t / z.chunk() * z.chunk());
            }
            if (r == 0) work0 = work;
            EXPECT_EQ(work, work0) << "cp " << cp << " rank " << r;
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), seq);
        for (int64_t g = 0; g < 2 * cp; ++g) {
            const ZigzagOwner o = zigzag(cp, 0, seq).owner(g);
            EXPECT_EQ(zigzag(cp, o.rank, seq).span_chunk(o.span), g);
        }
    }
}

TEST(Zigzag, LengthsThatDoNotCutAreInternalErrors) {
    EXPECT_THROW(zigzag(2, 0, 6), mt::core::Error);  // 6 tokens are not 2 x 2 chunks
    EXPECT_THROW(zigzag(2, 2, 8), mt::core::Error);  // rank outside the group
    EXPECT_EQ(cp_granularity(4), 512);
}

// With one rank the moves are copies: local rows are the whole sequence (chunks 0 and 1 in order).
TEST(Zigzag, RowMovesOfOneRankAreCopies) {
    auto self = comm_make_self();
    const mt::nn::ContextParallel cp{.comm = self.get()};
    const mt::core::Tensor whole = mt::core::Tensor::zeros({2, 4, 3}, mt::core::DType::f32);
    for (int64_t i = 0; i < whole.numel(); ++i) mt::core::tensor_set_flat(whole, i, static_cast<double>(i));
    const mt::core::Tensor local = mt::core::Tensor::zeros({2, 4, 3}, mt::core::DType::f32);
    mt::nn::cp_local_rows(cp, whole, local);
    const mt::core::Tensor back = mt::core::Tensor::zeros({2, 4, 3}, mt::core::DType::f32);
    mt::nn::cp_gather_rows(cp, local, back);
    const mt::core::Tensor sum = mt::core::Tensor::zeros({2, 4, 3}, mt::core::DType::f32);
    mt::nn::cp_reduce_scatter_rows(cp, whole, sum);
    for (int64_t i = 0; i < whole.numel(); ++i) {
        EXPECT_EQ(mt::core::tensor_get_flat(local, i), static_cast<double>(i));
        EXPECT_EQ(mt::core::tensor_get_flat(back, i), static_cast<double>(i));
        EXPECT_EQ(mt::core::tensor_get_flat(sum, i), static_cast<double>(i));
    }
}
