// The execution context (core/exec.h): the process default, ExecScope nesting per thread, and on a GPU that ops
// called under the side lane queue their work on its stream (captured into a CUDA graph instead of running) and
// that each lane reuses only the memory it freed.
#include "core/exec.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "ops/add.h"

#ifdef MT_HAVE_CUDA
#include "core/cuda/cuda_check.h"
#endif

namespace mt::core {
namespace {

TEST(ExecCtx, DefaultIsTheMainLaneAndDeterministic) {
    EXPECT_EQ(exec().lane, Lane::main);
    EXPECT_TRUE(exec().deterministic);
    EXPECT_EQ(&exec(), &default_exec());
}

TEST(ExecCtx, ScopesNestAndRestore) {
    {
        const ExecScope outer({Lane::side, true});
        EXPECT_EQ(exec().lane, Lane::side);
        {
            const ExecScope inner({Lane::main, false});
            EXPECT_EQ(exec().lane, Lane::main);
            EXPECT_FALSE(exec().deterministic);
        }
        EXPECT_EQ(exec().lane, Lane::side);
        EXPECT_TRUE(exec().deterministic);
    }
    EXPECT_EQ(&exec(), &default_exec());
}

TEST(ExecCtx, ScopeIsPerThreadAndTheDefaultIsShared) {
    const ExecScope scope({Lane::side, true});
    Lane seen = Lane::side;
    std::thread([&] { seen = exec().lane; }).join();
    EXPECT_EQ(seen, Lane::main);  // another thread is outside this thread's scope
    set_default_exec({Lane::main, false});
    bool det = true;
    std::thread([&] { det = exec().deterministic; }).join();
    set_default_exec({});
    EXPECT_FALSE(det);
}

TEST(ExecCtx, CpuOpsRunTheSameOnEitherLane) {
    const Tensor a = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({4}, DType::f32);
    for (int i = 0; i < 4; ++i) {
        a.data<float>()[i] = static_cast<float>(i);
        b.data<float>()[i] = 1.0f;
    }
    const Tensor out = Tensor::zeros({4}, DType::f32);
    const ExecScope scope({Lane::side, true});
    ops::add_fwd(a, b, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.data<float>()[i], static_cast<float>(i) + 1.0f);
    lane_wait(Lane::main, Lane::side);  // nothing to order on the CPU
}

#ifdef MT_HAVE_CUDA
// An op called under the side lane while that lane's stream is being captured must land in the graph: if it ran on
// the main stream instead, `out` would hold the sum before the graph is launched, and the graph would be empty.
TEST(GpuExec, OpsQueueOnTheirLanesStream) {
    if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device";
    const int64_t n = 1 << 16;
    const Tensor ones = Tensor::zeros({n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) ones.data<float>()[i] = 1.0f;
    const Tensor a = ones.to_device(Device::cuda), b = ones.to_device(Device::cuda);
    const Tensor out = Tensor::zeros({n}, DType::f32, Device::cuda);
    backend_get(Device::cuda).synchronize();
    const cudaStream_t side = lane_stream(Lane::side);
    ASSERT_NE(side, lane_stream(Lane::main));
    cudaGraph_t graph = nullptr;
    {
        const ExecScope scope({Lane::side, true});
        ASSERT_EQ(exec_stream(), side);
        ASSERT_EQ(cudaStreamBeginCapture(side, cudaStreamCaptureModeRelaxed), cudaSuccess);
        ops::add_fwd(a, b, out);
        ASSERT_EQ(cudaStreamEndCapture(side, &graph), cudaSuccess);
    }
    size_t nodes = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
    EXPECT_GE(nodes, 1u);
    const Tensor before = out.to_device(Device::cpu);
    for (int64_t i = 0; i < n; i += 4097) ASSERT_EQ(before.data<float>()[i], 0.0f) << "the op ran on another stream";
    cudaGraphExec_t run = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&run, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(run, side), cudaSuccess);
    lane_wait(Lane::main, Lane::side);  // the copy below runs on the main lane
    const Tensor after = out.to_device(Device::cpu);
    for (int64_t i = 0; i < n; i += 4097) EXPECT_EQ(after.data<float>()[i], 2.0f);
    cudaGraphExecDestroy(run);
    cudaGraphDestroy(graph);
}

// Memory freed by one lane goes back to that lane's pool: the other lane cannot be handed it while the first may
// still be using it.
TEST(GpuExec, EachLaneReusesOnlyItsOwnMemory) {
    if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device";
    Backend& be = backend_get(Device::cuda);
    const size_t bytes = (size_t{3} << 20) + 512;  // a size class no other test is likely to leave cached
    void* side_block = nullptr;
    {
        const ExecScope scope({Lane::side, true});
        side_block = be.alloc_scratch(bytes);
        be.free(side_block, bytes);
    }
    void* main_block = be.alloc_scratch(bytes);
    EXPECT_NE(main_block, side_block);
    {
        const ExecScope scope({Lane::side, true});
        void* again = be.alloc_scratch(bytes);
        EXPECT_EQ(again, side_block);
        be.free(again, bytes);
    }
    be.free(main_block, bytes);
    be.synchronize();
}
#endif

}  // namespace
}  // namespace mt::core
