// Mesh arithmetic (rank order, coordinates, groups), impossible layouts, the self backend of Comm and its clock; all in
// one process, without MPI.
#include "parallel/mesh.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "parallel/comm.h"

using mt::core::Error;
using mt::core::ExitCode;
using namespace mt::parallel;

namespace {

template <typename F>
void expect_usage_error(F&& f, std::initializer_list<const char*> needles) {
    try {
        f();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
        for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

MeshShape shape_of(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp) {
    MeshShape s;
    s.size = {tp, cp, ep, dp, pp};
    return s;
}

}  // namespace

TEST(Mesh, RankOrderIsTpFastestThenCpEpDpPp) {
    const MeshShape s = shape_of(2, 1, 2, 3, 2);
    ASSERT_EQ(s.world(), 24);
    EXPECT_EQ(mesh_coord(s, 0), (MeshCoord{0, 0, 0, 0, 0}));
    EXPECT_EQ(mesh_coord(s, 1), (MeshCoord{1, 0, 0, 0, 0}));   // tp moves first
    EXPECT_EQ(mesh_coord(s, 2), (MeshCoord{0, 0, 1, 0, 0}));   // then ep (cp = 1)
    EXPECT_EQ(mesh_coord(s, 4), (MeshCoord{0, 0, 0, 1, 0}));   // then dp
    EXPECT_EQ(mesh_coord(s, 12), (MeshCoord{0, 0, 0, 0, 1}));  // pp slowest
    EXPECT_EQ(mesh_coord(s, 23), (MeshCoord{1, 0, 1, 2, 1}));
    for (int64_t r = 0; r < s.world(); ++r) EXPECT_EQ(mesh_rank(s, mesh_coord(s, r)), r);
}

TEST(Mesh, GroupsHoldTheRanksThatDifferOnlyAlongTheirAxes) {
    const MeshShape s = shape_of(2, 1, 2, 2, 1);  // world 8
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::tp), (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::ep), (std::vector<int64_t>{5, 7}));
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::dp), (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::dp_span), (std::vector<int64_t>{1, 3, 5, 7}));
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::edp), (std::vector<int64_t>{1, 5}));
    EXPECT_EQ(mesh_group_ranks(s, 5, MeshGroup::pp), (std::vector<int64_t>{5}));
    // Every rank is in exactly one group of each kind, and the groups have the product of their axes' sizes.
    for (int g = 0; g < kMeshGroups; ++g) {
        std::vector<int> seen(8, 0);
        for (int64_t r = 0; r < 8; ++r)
            if (mesh_group_ranks(s, r, static_cast<MeshGroup>(g)).front() == r)
                for (int64_t m : mesh_group_ranks(s, r, static_cast<MeshGroup>(g))) ++seen[static_cast<size_t>(m)];
        EXPECT_EQ(seen, std::vector<int>(8, 1)) << mesh_group_name(static_cast<MeshGroup>(g));
    }
}

TEST(Mesh, ResolveFillsDataParallelAndChecksTheProduct) {
    EXPECT_EQ(mesh_resolve({}, 4, {}, "job.toml"), shape_of(1, 1, 1, 4, 1));
    EXPECT_EQ(mesh_resolve({.ep = 2}, 8, {.moe = true, .num_experts = 4}, "job.toml"), shape_of(1, 1, 2, 4, 1));
    EXPECT_EQ(mesh_resolve({.dp = 2}, 2, {}, "job.toml"), shape_of(1, 1, 1, 2, 1));
}

TEST(Mesh, ImpossibleLayoutsNameTheKeys) {
    expect_usage_error([] { mesh_resolve({.dp = 3}, 2, {}, "job.toml"); },
                       {"parallel.tp x cp x ep x dp x pp", "= 3", "2 processes", "job.toml"});
    expect_usage_error([] { mesh_resolve({.tp = 3}, 4, {}, "job.toml"); }, {"does not divide the 4 processes"});
    expect_usage_error([] { mesh_resolve({.ep = 2}, 2, {}, "job.toml"); }, {"parallel.ep = 2", "moe.enabled"});
    expect_usage_error([] { mesh_resolve({.ep = 4}, 4, {.moe = true, .num_experts = 6}, "job.toml"); },
                       {"moe.num_experts = 6", "parallel.ep = 4"});
    expect_usage_error([] { mesh_resolve({.pp = 0}, 1, {}, "job.toml"); }, {"parallel.pp = 0"});
}

TEST(Mesh, JsonRoundTrip) {
    const MeshShape s = shape_of(1, 1, 2, 2, 1);
    const auto self = comm_make_self();
    Mesh mesh(*self, shape_of(1, 1, 1, 1, 1));
    EXPECT_EQ(mesh.to_json().at("order"), "tp-cp-ep-dp-pp");
    EXPECT_EQ(mesh.to_json().at("world"), 1);
    nlohmann::json j = {{"tp", 1}, {"cp", 1}, {"ep", 2}, {"dp", 2}, {"pp", 1}};
    EXPECT_EQ(mesh_shape_from_json(j), s);
    EXPECT_EQ(mesh_describe(s), "tp=1 cp=1 ep=2 dp=2 pp=1");
}

TEST(CommSelf, CollectivesAreCopiesInAWorldOfOne) {
    auto comm = comm_make_self();
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(comm->backend(), "self");
    std::vector<float> a = {1, 2, 3}, b(3, 0.f);
    comm->all_reduce(a.data(), 3, CommType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
    comm->reduce_scatter(a.data(), b.data(), 3, CommType::f32, ReduceOp::sum).wait();
    EXPECT_EQ(b, a);
    const std::vector<int64_t> counts = {3};
    std::vector<float> c(3, 0.f);
    comm->all_to_all_v(a.data(), counts, c.data(), counts, CommType::f32).wait();
    EXPECT_EQ(c, a);
    EXPECT_EQ(comm->stats(CommOp::all_reduce).calls, 1);
    EXPECT_EQ(comm->stats(CommOp::all_to_all_v).bytes, 12);
    EXPECT_EQ(comm_all_reduce_sum(*comm, 2.5), 2.5);
    EXPECT_EQ(comm->split(0, 0)->size(), 1);
}

// Nested timers on one clock (NCCL's barrier waits on its own handle inside the call) add the outermost interval
// only: counting both would exceed the time measured around the outer one.
TEST(CommClock, NestedTimersCountTheOutermostIntervalOnce) {
    CommClock clock;
    const auto start = std::chrono::steady_clock::now();
    {
        const CommTimer outer(&clock);
        const CommTimer inner(&clock);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double around = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(clock.depth, 0);
    EXPECT_GE(clock.seconds, 0.02);
    EXPECT_LE(clock.seconds, around);
    const CommTimer none(nullptr);  // no clock: nothing to add to
}

// Half-precision rows (tensor parallelism's reductions of GPU activations) have comm types of their own, two bytes
// each; NCCL reduces them (CommNccl.* on the GPU).
TEST(CommType, HalfPrecisionTensorsMapToTwoByteTypes) {
    EXPECT_EQ(comm_type_of(mt::core::DType::bf16), CommType::bf16);
    EXPECT_EQ(comm_type_of(mt::core::DType::f16), CommType::f16);
    EXPECT_EQ(comm_type_size(CommType::bf16), 2u);
    EXPECT_EQ(comm_type_size(CommType::f16), 2u);
    EXPECT_EQ(comm_type_of(mt::core::DType::f32), CommType::f32);
}
