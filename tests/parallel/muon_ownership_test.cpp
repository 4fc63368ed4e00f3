// Whole-matrix ownership's plan (parallel/muon_ownership.h, muon.md §3): the LPT assignment against a hand-worked
// example, the packed blocks partitioning the bucket's elements exactly once, the padding, the cap on owner
// positions, and the bucket limits that make a Muon bucket hold 2 R matrices.
#include "parallel/muon_ownership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "parallel/grad_sync.h"

namespace mt::parallel {
namespace {

// Parameters laid out back to back: (numel, rows, cols); rows = 0 marks an element-sharded (AdamW) parameter.
std::vector<ArenaParam> layout(const std::vector<std::array<int64_t, 3>>& shapes) {
    std::vector<ArenaParam> params;
    int64_t at = 0;
    for (const auto& [numel, rows, cols] : shapes) {
        params.push_back({.begin = at, .numel = numel, .end = at + numel, .matrix_rows = rows, .matrix_cols = cols});
        at += numel;
    }
    return params;
}

// How many blocks of `plan` hold each arena element.
std::map<int64_t, int> coverage(const PackedBucket& plan) {
    std::map<int64_t, int> held;
    for (const auto& block : plan.blocks)
        for (const optim::ArenaRange& r : block)
            for (int64_t e = r.begin; e < r.end; ++e) ++held[e];
    return held;
}

TEST(MuonOwnership, NewtonSchulzCostIsSymmetric) {
    EXPECT_DOUBLE_EQ(newton_schulz_flops(2, 8), 4.0 * 4 * 8 + 2.0 * 8);
    EXPECT_DOUBLE_EQ(newton_schulz_flops(8, 2), newton_schulz_flops(2, 8));
}

TEST(MuonOwnership, LongestProcessingTimeFirstOverTwoRanks) {
    // Matrices of cost 4x4 (384), 2x4 (80) three times, and a 4-element norm gain first (AdamW).
    const auto params = layout({{4, 0, 0}, {16, 4, 4}, {24, 2, 4}});
    OwnerLoad load;
    const PackedBucket plan = plan_packed_bucket(params, 0, 3, 2, 2, load);
    ASSERT_EQ(plan.matrices.size(), 4u);
    // LPT: the 4x4 goes to rank 0 (384), then the three 2x4s to rank 1, rank 1, rank 1 (80, 160, 240 < 384).
    EXPECT_EQ(plan.matrices[0].owner, 0);
    EXPECT_EQ(plan.matrices[1].owner, 1);
    EXPECT_EQ(plan.matrices[2].owner, 1);
    EXPECT_EQ(plan.matrices[3].owner, 1);
    EXPECT_DOUBLE_EQ(load.cost[0], 384.0);
    EXPECT_DOUBLE_EQ(load.cost[1], 240.0);
    // Blocks: rank 0 = gain [0, 2) + the 4x4 [4, 20); rank 1 = gain [2, 4) + the three 2x4s [20, 44).
    ASSERT_EQ(plan.blocks[0].size(), 2u);
    EXPECT_EQ(plan.blocks[0][0].begin, 0);
    EXPECT_EQ(plan.blocks[0][0].end, 2);
    EXPECT_EQ(plan.blocks[0][1].begin, 4);
    EXPECT_EQ(plan.blocks[0][1].end, 20);
    ASSERT_EQ(plan.blocks[1].size(), 2u);
    EXPECT_EQ(plan.blocks[1][1].begin, 20);
    EXPECT_EQ(plan.blocks[1][1].end, 44);
    EXPECT_EQ(plan.shard, 26);
    EXPECT_EQ(plan.padding, 26 - 18);
    EXPECT_EQ(plan.payload, 44);
    // The load carries over: a second bucket's first matrix goes to the lighter rank 1.
    const auto more = layout({{16, 4, 4}});
    const PackedBucket next = plan_packed_bucket(more, 0, 1, 2, 2, load);
    EXPECT_EQ(next.matrices[0].owner, 1);
}

TEST(MuonOwnership, BlocksPartitionTheBucket) {
    // A mix of gains, a stack of 6 experts and odd shapes over 1 to 5 ranks.
    const auto params = layout({{7, 0, 0}, {6 * 12, 3, 4}, {5, 0, 0}, {20, 5, 4}, {33, 0, 0}, {8, 8, 1}});
    for (int64_t ranks = 1; ranks <= 5; ++ranks) {
        OwnerLoad load;
        const PackedBucket plan = plan_packed_bucket(params, 0, static_cast<int>(params.size()), ranks, ranks, load);
        const std::map<int64_t, int> held = coverage(plan);
        EXPECT_EQ(static_cast<int64_t>(held.size()), params.back().end) << ranks << " ranks";
        for (const auto& [e, n] : held) EXPECT_EQ(n, 1) << "element " << e << ", " << ranks << " ranks";
        int64_t padding = 0;
        for (const auto& block : plan.blocks) {
            int64_t n = 0;
            for (const optim::ArenaRange& r : block) n += r.end - r.begin;
            EXPECT_LE(n, plan.shard);
            padding += plan.shard - n;
        }
        EXPECT_EQ(padding, plan.padding);
        EXPECT_EQ(plan.matrices.size(), 6u + 1u + 1u);
        for (const OwnedMatrix& m : plan.matrices) EXPECT_LT(m.owner, ranks);
    }
}

TEST(MuonOwnership, CappedPositionsRepeatTheirMatrices) {
    // 4 ranks, 2 owner positions: ranks 0 and 2 hold position 0's matrices, 1 and 3 position 1's; the element-sharded
    // part is still cut over all four.
    const auto params = layout({{8, 0, 0}, {4 * 6, 2, 3}});
    OwnerLoad load;
    const PackedBucket plan = plan_packed_bucket(params, 0, 2, 4, 2, load);
    ASSERT_EQ(load.cost.size(), 2u);
    const std::map<int64_t, int> held = coverage(plan);
    for (int64_t e = 0; e < 8; ++e) EXPECT_EQ(held.at(e), 1) << e;
    for (int64_t e = 8; e < 32; ++e) EXPECT_EQ(held.at(e), 2) << e;
    for (int r = 0; r < 2; ++r) {
        ASSERT_EQ(plan.blocks[r].size(), plan.blocks[r + 2].size());
        for (size_t k = 1; k < plan.blocks[r].size(); ++k) {
            EXPECT_EQ(plan.blocks[r][k].begin, plan.blocks[r + 2][k].begin);
            EXPECT_EQ(plan.blocks[r][k].end, plan.blocks[r + 2][k].end);
        }
    }
    OwnerLoad bad;
    EXPECT_THROW(plan_packed_bucket(params, 0, 2, 2, 3, bad), core::Error);
}

TEST(MuonOwnership, MuonBucketsHoldTwoMatricesPerRank) {
    // Eight 4x4 matrices each followed by a gain, limits far below one matrix: without the rule every parameter is a
    // bucket of its own; with 2 R = 4 there are two buckets of four matrices (and their gains).
    std::vector<std::array<int64_t, 3>> shapes;
    for (int k = 0; k < 8; ++k) shapes.push_back({16, 4, 4}), shapes.push_back({4, 0, 0});
    const auto params = layout(shapes);
    const auto plain = grad_sync_buckets(params, 4, BucketLimits{.bucket_mb = 1e-6, .muon_bucket_mb = 1e-6});
    EXPECT_EQ(plain.size(), params.size());
    const auto buckets =
        grad_sync_buckets(params, 4, BucketLimits{.bucket_mb = 1e-6, .muon_bucket_mb = 1e-6, .min_matrices_dense = 4});
    ASSERT_EQ(buckets.size(), 2u);
    for (size_t k = 0; k < buckets.size(); ++k) {
        int64_t matrices = 0;
        for (const ArenaParam& p : params)
            if (p.begin >= buckets[k].begin && p.begin < buckets[k].end && p.matrix_rows > 0) ++matrices;
        EXPECT_EQ(matrices, 4) << "bucket " << k;
    }
}

}  // namespace
}  // namespace mt::parallel
