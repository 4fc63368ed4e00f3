// The pipeline schedules and the balanced layer split (src/parallel/pipeline_schedule.h), without MPI.
#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

using namespace mt::parallel;

namespace {

std::string render(const std::vector<PipeOp>& ops) {
    std::string s;
    for (const PipeOp& op : ops) s += fmt::format("{}{}{} ", op.forward ? 'F' : 'B', op.chunk, op.micro);
    return s;
}

}  // namespace

TEST(PipelineSchedule, OneFOneBWarmsUpThenAlternates) {
    // 4 stages, 6 micro-batches: stage 0 runs 3 warm-up forwards, the last stage none.
    EXPECT_EQ(render(pipeline_schedule(4, 0, 1, 6)), "F00 F01 F02 F03 B00 F04 B01 F05 B02 B03 B04 B05 ");
    EXPECT_EQ(render(pipeline_schedule(4, 3, 1, 6)), "F00 B00 F01 B01 F02 B02 F03 B03 F04 B04 F05 B05 ");
    EXPECT_EQ(render(pipeline_schedule(2, 0, 1, 1)), "F00 B00 ");
}

TEST(PipelineSchedule, EveryRankRunsEveryChunkAndMicroBatchOnceEachWay) {
    for (int64_t p : {2, 3, 4})
        for (int64_t v : {1, 2, 3})
            for (int64_t s = 0; s < p; ++s) {
                const int64_t m = 2 * p;
                std::set<std::tuple<bool, int64_t, int64_t>> seen;
                int64_t forwards = 0;
                for (const PipeOp& op : pipeline_schedule(p, s, v, m)) {
                    EXPECT_TRUE(seen.insert({op.forward, op.chunk, op.micro}).second);
                    // A backward comes after its own forward.
                    if (!op.forward) {
                        EXPECT_TRUE(seen.count({true, op.chunk, op.micro}));
                    }
                    forwards += op.forward ? 1 : 0;
                }
                EXPECT_EQ(forwards, v * m);
                EXPECT_EQ(static_cast<int64_t>(seen.size()), 2 * v * m);
            }
}

TEST(PipelineSchedule, InterleavedFollowsMegatronsOrder) {
    // 2 stages, 2 virtual stages, 4 micro-batches, stage 1: (2 - 1 - 1) * 2 + (2 - 1) * 2 = 2 warm-up forwards;
    // forwards take chunks 0, 0, 1, 1 for micro-batches 0, 1, 0, 1, then 2, 3; backwards start with chunk 1.
    EXPECT_EQ(render(pipeline_schedule(2, 1, 2, 4)),
              "F00 F01 F10 B10 F11 B11 F02 B00 F03 B01 F12 B12 F13 B13 B02 B03 ");
    EXPECT_DOUBLE_EQ(pipeline_bubble(4, 1, 8), 3.0 / 11.0);
    EXPECT_DOUBLE_EQ(pipeline_bubble(4, 2, 8), 3.0 / 19.0);
}

TEST(PipelineSplit, BalancesTheLargestChunk) {
    EXPECT_EQ(pipeline_split({1, 1, 1, 1}, 0, 0, 2), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(pipeline_split({1, 1, 1, 1, 1, 1}, 0, 2, 2), (std::vector<int64_t>{4, 2}));  // the head costs 2 layers
    EXPECT_EQ(pipeline_split({4, 1, 1, 1, 1}, 0, 0, 2), (std::vector<int64_t>{1, 4}));
    EXPECT_EQ(pipeline_split({1, 1, 1}, 0, 0, 3), (std::vector<int64_t>{1, 1, 1}));
}
