// The NCCL backend of Comm under mpirun, on device buffers: every operation against values each rank can compute
// alone (the cases of comm_mpi_test.cpp), a large all-reduce, the batching of sends and receives, split and the
// counters. Skipped, with the reason, where the build has no NCCL or the machine has fewer GPUs than ranks (CI);
// there the factory's error is checked instead. CommNccl.* runs under the CTest entries mpi_gpu.npN (labels gpu, mpi;
// tests/CMakeLists.txt names the suite), CommNcclSetup under mpi.npN with the CPU cases.
#include "parallel/comm_nccl.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/cuda_probe.h"
#include "core/tensor.h"
#include "parallel/mpi/uneven_all_to_all.h"
#include "parallel/runtime.h"

using namespace mt::parallel;
using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

namespace {

Comm& world() {
    return dist_world();
}

// Why the NCCL cases cannot run here, or empty. Decided together (a rank that skipped alone would leave the others
// waiting in a collective).
const std::string& skip_reason() {
    static const std::string reason = [] {
        const int n = world().size();
        const int gpus = mt::core::cuda_device_count();
        const int64_t ok = comm_nccl_compiled() && gpus >= n ? 1 : 0;
        if (-comm_all_reduce_max(world(), -ok) == 1) return std::string();
        if (!comm_nccl_compiled()) return std::string("this build has no NCCL (CMake found no nccl.h / libnccl)");
        return fmt::format("the NCCL backend needs a GPU per rank: {} ranks, {} visible GPUs", n, gpus);
    }();
    return reason;
}

// A device copy of host values, as raw bytes (Tensor has no u64 dtype); at least one byte, so a zero-length
// buffer still has an address.
template <typename T>
Tensor to_gpu(std::vector<T> host) {
    const auto bytes = static_cast<int64_t>(host.size() * sizeof(T));
    if (bytes == 0) return Tensor::zeros({1}, DType::u8, Device::cuda);
    return Tensor::borrow(host.data(), {bytes}, DType::u8).to_device(Device::cuda);
}

template <typename T>
std::vector<T> to_host(const Tensor& dev, size_t n) {
    std::vector<T> out(n);
    if (n == 0) return out;
    const Tensor host = dev.to_device(Device::cpu);
    std::memcpy(out.data(), host.raw(), n * sizeof(T));
    return out;
}

template <typename T>
T* ptr(const Tensor& dev) {
    return static_cast<T*>(dev.raw());
}

class CommNccl : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        if (skip_reason().empty()) nccl_ = comm_make_nccl(world());
    }
    static void TearDownTestSuite() {
        nccl_.reset();
    }
    void SetUp() override {
        if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
    }
    static Comm& comm() {
        return *nccl_;
    }

    static inline std::unique_ptr<Comm> nccl_;
};

}  // namespace

// Runs where the others skip: without NCCL or without a GPU the factory fails with a message, not a crash.
TEST(CommNcclSetup, FailsClearlyWithoutNcclOrGpu) {
    if (comm_nccl_compiled() && mt::core::cuda_device_count() > 0) GTEST_SKIP() << "NCCL and a GPU are present";
    try {
        auto c = comm_make_nccl(world());
        FAIL() << "comm_make_nccl succeeded without NCCL or a GPU";
    } catch (const mt::core::Error& e) {
        EXPECT_EQ(e.code(), comm_nccl_compiled() ? mt::core::ExitCode::device : mt::core::ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find(comm_nccl_compiled() ? "CUDA device" : "without NCCL"), std::string::npos)
            << e.what();
    }
}

TEST_F(CommNccl, RanksMatchTheBootstrap) {
    EXPECT_EQ(comm().backend(), "nccl");
    EXPECT_EQ(comm().rank(), world().rank());
    EXPECT_EQ(comm().size(), world().size());
    const int device = comm_nccl_local_device();
    EXPECT_GE(device, 0);
    EXPECT_LT(device, mt::core::cuda_device_count());
    // One node (as in these tests): the local rank is the world rank.
    if (world().size() <= mt::core::cuda_device_count()) {
        EXPECT_EQ(device, world().rank());
    }
}

TEST_F(CommNccl, AllReduceEveryTypeAndOp) {
    const int r = comm().rank(), n = comm().size();
    const Tensor f = to_gpu(std::vector<float>{1.0f * r, 0.5f, -1.0f * r});
    const Tensor d = to_gpu(std::vector<double>{static_cast<double>(r)});
    const Tensor i = to_gpu(std::vector<int64_t>{r + 10});
    const Tensor h = to_gpu(std::vector<uint64_t>{uint64_t{1} << 40, static_cast<uint64_t>(r)});
    const Tensor k = to_gpu(std::vector<int32_t>{r});
    const Tensor b = to_gpu(std::vector<uint8_t>{static_cast<uint8_t>(200 + r)});
    // All in flight at once, waited for in another order.
    CommWork wf = comm().all_reduce(ptr<float>(f), 3, CommType::f32, ReduceOp::sum);
    CommWork wd = comm().all_reduce(ptr<double>(d), 1, CommType::f64, ReduceOp::max);
    CommWork wi = comm().all_reduce(ptr<int64_t>(i), 1, CommType::i64, ReduceOp::min);
    CommWork wh = comm().all_reduce(ptr<uint64_t>(h), 2, CommType::u64, ReduceOp::sum);
    CommWork wk = comm().all_reduce(ptr<int32_t>(k), 1, CommType::i32, ReduceOp::sum);
    CommWork wb = comm().all_reduce(ptr<uint8_t>(b), 1, CommType::u8, ReduceOp::max);
    wb.wait();
    wk.wait();
    wh.wait();
    wi.wait();
    wd.wait();
    wf.wait();
    const float tri = static_cast<float>(n * (n - 1) / 2);
    EXPECT_EQ(to_host<float>(f, 3), (std::vector<float>{tri, 0.5f * n, -tri}));
    EXPECT_EQ(to_host<double>(d, 1)[0], n - 1);
    EXPECT_EQ(to_host<int64_t>(i, 1)[0], 10);
    EXPECT_EQ(to_host<uint64_t>(h, 2), (std::vector<uint64_t>{static_cast<uint64_t>(n) << 40, uint64_t(tri)}));
    EXPECT_EQ(to_host<int32_t>(k, 1)[0], n * (n - 1) / 2);
    EXPECT_EQ(to_host<uint8_t>(b, 1)[0], 200 + n - 1);
}

TEST_F(CommNccl, LargeAllReduceIsExact) {
    // 64 MiB of f32 (NCCL pipelines it in many chunks): element j of rank r is (j % 1000) + r, small integers whose
    // sums are exact in any order.
    const int r = comm().rank(), n = comm().size();
    const int64_t count = int64_t{1} << 24;
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t j = 0; j < count; ++j) x[size_t(j)] = static_cast<float>(j % 1000 + r);
    const Tensor dev = to_gpu(x);
    comm().all_reduce(ptr<float>(dev), count, CommType::f32, ReduceOp::sum).wait();
    const auto y = to_host<float>(dev, size_t(count));
    int64_t wrong = 0;
    for (int64_t j = 0; j < count; ++j) wrong += y[size_t(j)] != static_cast<float>(n * (j % 1000) + n * (n - 1) / 2);
    EXPECT_EQ(wrong, 0);
}

TEST_F(CommNccl, ReduceScatterAndAllGatherInPlace) {
    const int r = comm().rank(), n = comm().size();
    const int64_t count = 3;
    std::vector<float> send(static_cast<size_t>(count * n));
    for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>(j + 100 * r);
    const Tensor dsend = to_gpu(send), drecv = to_gpu(std::vector<float>(size_t(count), -1.0f));
    comm().reduce_scatter(ptr<float>(dsend), ptr<float>(drecv), count, CommType::f32, ReduceOp::sum).wait();
    const auto recv = to_host<float>(drecv, size_t(count));
    for (int64_t j = 0; j < count; ++j)
        EXPECT_EQ(recv[size_t(j)], static_cast<float>(n * (r * count + j) + 100 * n * (n - 1) / 2));
    // In place: each rank's block already sits at its offset of the output.
    std::vector<float> all(static_cast<size_t>(count * n), -1.0f);
    std::copy(recv.begin(), recv.end(), all.begin() + r * count);
    const Tensor dall = to_gpu(all);
    comm().all_gather(ptr<float>(dall) + r * count, ptr<float>(dall), count, CommType::f32).wait();
    const auto got = to_host<float>(dall, all.size());
    for (int q = 0; q < n; ++q)
        for (int64_t j = 0; j < count; ++j)
            EXPECT_EQ(got[size_t(q * count + j)], static_cast<float>(n * (q * count + j) + 100 * n * (n - 1) / 2));
    // Out of place.
    const Tensor mine = to_gpu(std::vector<int64_t>{r, -r}), out = to_gpu(std::vector<int64_t>(size_t(2 * n), 7));
    comm().all_gather(ptr<int64_t>(mine), ptr<int64_t>(out), 2, CommType::i64).wait();
    const auto o = to_host<int64_t>(out, size_t(2 * n));
    for (int q = 0; q < n; ++q) {
        EXPECT_EQ(o[size_t(2 * q)], q);
        EXPECT_EQ(o[size_t(2 * q + 1)], -q);
    }
}

TEST_F(CommNccl, AllToAllVWithUnevenCounts) {
    const mt::testing::UnevenAllToAll c(comm().rank(), comm().size());
    const Tensor dsend = to_gpu(c.send), drecv = to_gpu(std::vector<int32_t>(c.recv_total(), -1));
    const int64_t bytes_before = comm().stats(CommOp::all_to_all_v).bytes;
    comm().all_to_all_v(ptr<int32_t>(dsend), c.send_counts, ptr<int32_t>(drecv), c.recv_counts, CommType::i32).wait();
    c.expect_received(to_host<int32_t>(drecv, c.recv_total()));
    EXPECT_EQ(comm().stats(CommOp::all_to_all_v).bytes - bytes_before, static_cast<int64_t>(c.send.size() * 4));
}

TEST_F(CommNccl, BroadcastSendRecvAndOverlappingHandles) {
    const int r = comm().rank(), n = comm().size();
    const Tensor b = to_gpu(std::vector<double>{r == 1 ? 3.25 : 0.0, r == 1 ? -7.0 : 0.0});
    comm().broadcast(ptr<double>(b), 2, CommType::f64, 1).wait();
    EXPECT_EQ(to_host<double>(b, 2), (std::vector<double>{3.25, -7.0}));
    // A ring as MPI code writes it: post the receive, then the send, then collectives, then wait. The receive and
    // send are batched and issued together before the first all-reduce, so no rank waits for a lone receive.
    const Tensor out = to_gpu(std::vector<int64_t>{1000 + r}), in = to_gpu(std::vector<int64_t>{-1});
    CommWork rx = comm().recv(ptr<int64_t>(in), 1, CommType::i64, (r + n - 1) % n, 7);
    CommWork tx = comm().send(ptr<int64_t>(out), 1, CommType::i64, (r + 1) % n, 7);
    const Tensor x = to_gpu(std::vector<float>(1000, 1.0f)), y = to_gpu(std::vector<float>(1000, 2.0f));
    CommWork wx = comm().all_reduce(ptr<float>(x), 1000, CommType::f32, ReduceOp::sum);
    CommWork wy = comm().all_reduce(ptr<float>(y), 1000, CommType::f32, ReduceOp::sum);
    wy.wait();
    wx.wait();
    tx.wait();
    rx.wait();
    EXPECT_EQ(to_host<int64_t>(in, 1)[0], 1000 + (r + n - 1) % n);
    EXPECT_EQ(to_host<float>(x, 1000)[999], static_cast<float>(n));
    EXPECT_EQ(to_host<float>(y, 1000)[0], 2.0f * n);
    // Only sends and receives, issued by waiting for the receive (the send is in the same batch).
    const Tensor in2 = to_gpu(std::vector<int64_t>{-1});
    CommWork rx2 = comm().recv(ptr<int64_t>(in2), 1, CommType::i64, (r + 1) % n, 8);
    CommWork tx2 = comm().send(ptr<int64_t>(out), 1, CommType::i64, (r + n - 1) % n, 8);
    rx2.wait();
    tx2.wait();
    EXPECT_EQ(to_host<int64_t>(in2, 1)[0], 1000 + (r + 1) % n);
    // A send to this rank itself is refused (NCCL would wait for a receive posted in the same group).
    EXPECT_THROW((void)comm().send(ptr<int64_t>(out), 1, CommType::i64, r, 0), mt::core::Error);
}

TEST_F(CommNccl, BarrierSplitAndCounters) {
    const int r = comm().rank(), n = comm().size();
    const int64_t barriers = comm().stats(CommOp::barrier).calls;
    comm().barrier();
    EXPECT_EQ(comm().stats(CommOp::barrier).calls, barriers + 1);
    // One color, keys reversed: the new ranks are in reverse order.
    std::unique_ptr<Comm> rev = comm().split(0, n - r);
    ASSERT_EQ(rev->size(), n);
    EXPECT_EQ(rev->rank(), n - 1 - r);
    EXPECT_EQ(rev->backend(), "nccl");
    const Tensor me = to_gpu(std::vector<int64_t>{r}), members = to_gpu(std::vector<int64_t>(size_t(n), -1));
    rev->all_gather(ptr<int64_t>(me), ptr<int64_t>(members), 1, CommType::i64).wait();
    std::vector<int64_t> expected(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) expected[size_t(q)] = n - 1 - q;
    EXPECT_EQ(to_host<int64_t>(members, size_t(n)), expected);
    EXPECT_EQ(rev->stats(CommOp::all_gather).calls, 1);
    EXPECT_EQ(rev->stats(CommOp::all_gather).bytes, 8);
    // Even and odd ranks: groups of size ceil/floor(n / 2), reduced separately.
    std::unique_ptr<Comm> half = comm().split(r % 2, r);
    EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
    EXPECT_EQ(half->rank(), r / 2);
    const Tensor v = to_gpu(std::vector<int32_t>{1});
    half->all_reduce(ptr<int32_t>(v), 1, CommType::i32, ReduceOp::sum).wait();
    EXPECT_EQ(to_host<int32_t>(v, 1)[0], half->size());
    half->barrier();
}
