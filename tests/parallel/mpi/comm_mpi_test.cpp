// The MPI backend of Comm under mpirun: every operation against values each rank can compute alone, with uneven
// all-to-all counts, in-place gathers, several handles in flight at once, u64 histograms, the host seconds counted,
// and the mesh's group communicators against mesh_group_ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "parallel/mesh.h"
#include "parallel/mpi/uneven_all_to_all.h"
#include "parallel/runtime.h"

using namespace mt::parallel;

namespace {

Comm& world() {
    return dist_world();
}

}  // namespace

TEST(CommMpi, LaunchedUnderMpirun) {
    EXPECT_EQ(world().backend(), "mpi");
    EXPECT_GT(world().size(), 1) << "run these tests with mpirun -np 2 or more";
}

TEST(CommMpi, AllReduceEveryTypeAndOp) {
    const int r = world().rank(), n = world().size();
    std::vector<float> f = {1.0f * r, 0.5f, -1.0f * r};
    world().all_reduce(f.data(), 3, CommType::f32, ReduceOp::sum).wait();
    const float tri = static_cast<float>(n * (n - 1) / 2);
    EXPECT_EQ(f, (std::vector<float>{tri, 0.5f * n, -tri}));
    std::vector<double> d = {static_cast<double>(r)};
    world().all_reduce(d.data(), 1, CommType::f64, ReduceOp::max).wait();
    EXPECT_EQ(d[0], n - 1);
    std::vector<int64_t> i = {r + 10};
    world().all_reduce(i.data(), 1, CommType::i64, ReduceOp::min).wait();
    EXPECT_EQ(i[0], 10);
    std::vector<uint64_t> h = {uint64_t{1} << 40, static_cast<uint64_t>(r)};
    world().all_reduce(h.data(), 2, CommType::u64, ReduceOp::sum).wait();
    EXPECT_EQ(h[0], static_cast<uint64_t>(n) << 40);
    EXPECT_EQ(h[1], static_cast<uint64_t>(n * (n - 1) / 2));
    std::vector<int32_t> k = {r};
    world().all_reduce(k.data(), 1, CommType::i32, ReduceOp::sum).wait();
    EXPECT_EQ(k[0], n * (n - 1) / 2);
}

TEST(CommMpi, ReduceScatterAndAllGatherInPlace) {
    const int r = world().rank(), n = world().size();
    const int64_t count = 3;
    std::vector<float> send(static_cast<size_t>(count * n)), recv(static_cast<size_t>(count));
    for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>(j + 100 * r);
    world().reduce_scatter(send.data(), recv.data(), count, CommType::f32, ReduceOp::sum).wait();
    for (int64_t j = 0; j < count; ++j)
        EXPECT_EQ(recv[size_t(j)], static_cast<float>(n * (r * count + j) + 100 * n * (n - 1) / 2));
    // In place: each rank's block already sits at its offset of the output.
    std::vector<float> all(static_cast<size_t>(count * n), -1.0f);
    std::copy(recv.begin(), recv.end(), all.begin() + r * count);
    world().all_gather(all.data() + r * count, all.data(), count, CommType::f32).wait();
    for (int q = 0; q < n; ++q)
        for (int64_t j = 0; j < count; ++j)
            EXPECT_EQ(all[size_t(q * count + j)], static_cast<float>(n * (q * count + j) + 100 * n * (n - 1) / 2));
    // Out of place, tensor form.
    auto mine = mt::core::Tensor::zeros({2}, mt::core::DType::i64);
    mine.data<int64_t>()[0] = r;
    mine.data<int64_t>()[1] = -r;
    auto out = mt::core::Tensor::zeros({2 * n}, mt::core::DType::i64);
    world().all_gather(mine, out).wait();
    for (int q = 0; q < n; ++q) {
        EXPECT_EQ(out.data<int64_t>()[2 * q], q);
        EXPECT_EQ(out.data<int64_t>()[2 * q + 1], -q);
    }
}

TEST(CommMpi, AllToAllVWithUnevenCounts) {
    const mt::testing::UnevenAllToAll c(world().rank(), world().size());
    std::vector<int32_t> recv(c.recv_total(), -1);
    world().all_to_all_v(c.send.data(), c.send_counts, recv.data(), c.recv_counts, CommType::i32).wait();
    c.expect_received(recv);
    EXPECT_EQ(world().stats(CommOp::all_to_all_v).bytes % 4, 0);
}

TEST(CommMpi, BroadcastSendRecvAndOverlappingHandles) {
    const int r = world().rank(), n = world().size();
    std::vector<double> b = {r == 1 ? 3.25 : 0.0, r == 1 ? -7.0 : 0.0};
    world().broadcast(b.data(), 2, CommType::f64, 1).wait();
    EXPECT_EQ(b, (std::vector<double>{3.25, -7.0}));
    // A ring: post the receive and the send, then do other collectives' worth of work before waiting.
    int64_t out = 1000 + r, in = -1;
    CommWork rx = world().recv(&in, 1, CommType::i64, (r + n - 1) % n, 7);
    CommWork tx = world().send(&out, 1, CommType::i64, (r + 1) % n, 7);
    std::vector<float> x(1000, 1.0f), y(1000, 2.0f);
    CommWork wx = world().all_reduce(x.data(), 1000, CommType::f32, ReduceOp::sum);
    CommWork wy = world().all_reduce(y.data(), 1000, CommType::f32, ReduceOp::sum);
    wy.wait();
    wx.wait();
    tx.wait();
    rx.wait();
    EXPECT_EQ(in, 1000 + (r + n - 1) % n);
    EXPECT_EQ(x[999], static_cast<float>(n));
    EXPECT_EQ(y[0], 2.0f * n);
    world().barrier();
}

// Comm::seconds() counts the host time inside the calls and inside the waits on their handles: the ranks that reach
// an all-reduce before rank 0, which sleeps first, wait for it there.
TEST(CommMpi, SecondsCountTheWaitForALateRank) {
    const double before = world().seconds();
    if (world().rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    double v = 1.0;
    CommWork work = world().all_reduce(&v, 1, CommType::f64, ReduceOp::sum);
    work.wait();
    const double spent = world().seconds() - before;
    EXPECT_EQ(v, static_cast<double>(world().size()));
    EXPECT_GT(spent, 0.0);
    if (world().rank() != 0) {
        EXPECT_GE(spent, 0.05) << "rank " << world().rank();
    }
}

TEST(MeshMpi, GroupCommunicatorsMatchTheArithmetic) {
    const int n = world().size();
    // The largest shape with ep = 2 that fits the world (ep needs an even world; else everything is dp).
    MeshShape s;
    s.size = {1, 1, n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1};
    Mesh mesh(world(), s);
    for (int g = 0; g < kMeshGroups; ++g) {
        Comm& c = mesh.group(static_cast<MeshGroup>(g));
        const auto expected = mesh_group_ranks(s, world().rank(), static_cast<MeshGroup>(g));
        ASSERT_EQ(c.size(), static_cast<int>(expected.size())) << mesh_group_name(static_cast<MeshGroup>(g));
        std::vector<int64_t> members(expected.size());
        int64_t me = world().rank();
        c.all_gather(&me, members.data(), 1, CommType::i64).wait();
        EXPECT_EQ(members, expected) << mesh_group_name(static_cast<MeshGroup>(g));
    }
}
