// CI rule of conventions §1.4: every op header in src/ops/ has at least one registered harness case, and every
// registered op name is a header; and the op registry (src/ops/registry.h): every kernel slot belongs to an op
// header with harness cases, every op has a CPU reference (and a CUDA kernel in a CUDA build), supports() answers
// by dtype, and an empty slot fails with the device error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "op_harness.h"
#include "ops/registry.h"

namespace mt::ops::test {
namespace {

TEST(OpCoverage, EveryHeaderHasCases) {
    const std::filesystem::path dir = std::filesystem::path(MT_SOURCE_DIR) / "src" / "ops";
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    const std::set<std::string> registered = op_registered_ops();
    std::set<std::string> headers;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const std::string file = entry.path().filename().string();
        if (entry.path().extension() != ".h" || file == "op_common.h" || file == "registry.h") continue;
        const std::string op = entry.path().stem().string();
        headers.insert(op);
        EXPECT_TRUE(registered.count(op)) << "src/ops/" << op << ".h has no registered case in tests/ops/";
    }
    EXPECT_GE(headers.size(), 10u);
    for (const std::string& op : registered)
        EXPECT_TRUE(headers.count(op)) << "cases are registered for \"" << op << "\" but src/ops/" << op
                                       << ".h does not exist";
}

// The op header that declares a kernel slot's entry point (a line "<type> NAME(" in src/ops/<op>.h), or "".
std::string header_of(const std::string& kernel) {
    const std::regex declaration("^(void|double|int64_t|std::vector<double>) " + kernel + "\\(");
    const std::filesystem::path dir = std::filesystem::path(MT_SOURCE_DIR) / "src" / "ops";
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".h") continue;
        std::ifstream in(entry.path());
        for (std::string line; std::getline(in, line);)
            if (std::regex_search(line, declaration)) return entry.path().stem().string();
    }
    return "";
}

// Kernels with a CPU reference only, each for a stated reason; the list is checked both ways (a CUDA kernel for one of
// them must take it off the list). attention_past: the zigzag ring of context parallelism (cp.attn = "ring") moves
// host tensors over MPI, and context parallelism on the GPU ends with exit 2 (docs/distributed.md), so no GPU run
// reaches these ops; their CUDA kernels come with the NCCL path of context parallelism.
const std::set<std::string> kCpuOnlyKernels = {"attention_past_fwd", "attention_past_bwd"};

TEST(OpCoverage, EveryRegisteredKernelBelongsToATestedOp) {
    const std::set<std::string> tested = op_registered_ops();
    const std::vector<std::string> kernels = registry::ops();
    EXPECT_GE(kernels.size(), 40u) << "the registry holds fewer slots than the ops of src/ops/";
    for (const std::string& kernel : kernels) {
        const std::string op = header_of(kernel);
        EXPECT_TRUE(tested.count(op)) << "kernel " << kernel << " is declared in src/ops/" << op
                                      << ".h, which has no harness cases (or in no op header)";
        EXPECT_TRUE(registry::has(kernel, core::Device::cpu)) << kernel << " has no CPU reference";
#ifdef MT_HAVE_CUDA
        if (kCpuOnlyKernels.count(kernel))
            EXPECT_FALSE(registry::has(kernel, core::Device::cuda))
                << kernel << " has a CUDA kernel now: take it off kCpuOnlyKernels";
        else
            EXPECT_TRUE(registry::has(kernel, core::Device::cuda)) << kernel << " has no CUDA kernel";
#endif
    }
    // Every tested op has at least one kernel.
    std::set<std::string> with_kernels;
    for (const std::string& kernel : kernels) with_kernels.insert(header_of(kernel));
    for (const std::string& op : tested)
        EXPECT_TRUE(with_kernels.count(op)) << "op " << op << " has harness cases but no registered kernel";
}

TEST(OpRegistry, SupportsAnswersByDeviceAndDtype) {
    EXPECT_TRUE(supports("rmsnorm_fwd", core::Device::cpu, core::DType::f32));
    EXPECT_TRUE(supports("rmsnorm_fwd", core::Device::cpu, core::DType::f64));
    EXPECT_FALSE(supports("rmsnorm_fwd", core::Device::cpu, core::DType::bf16));
    EXPECT_FALSE(supports("no_such_op", core::Device::cpu, core::DType::f32));
#ifdef MT_HAVE_CUDA
    EXPECT_TRUE(supports("rmsnorm_fwd", core::Device::cuda, core::DType::bf16));
    EXPECT_FALSE(supports("rmsnorm_fwd", core::Device::cuda, core::DType::f64));
#else
    EXPECT_FALSE(supports("rmsnorm_fwd", core::Device::cuda, core::DType::f32));
#endif
}

TEST(OpRegistry, EmptySlotIsADeviceError) {
    expect_op_error([] { kernel<void()>("no_such_op", core::Device::cpu); },
                    "no_such_op: not implemented on cpu",
                    core::ExitCode::device);
#ifndef MT_HAVE_CUDA
    expect_op_error([] { kernel<void()>("rmsnorm_fwd", core::Device::cuda); },
                    "rmsnorm_fwd: this build has no CUDA path",
                    core::ExitCode::device);
#endif
}

TEST(OpRegistry, WrongSignatureIsAnInternalError) {
    expect_op_error([] { kernel<void()>("rmsnorm_fwd", core::Device::cpu); },
                    "rmsnorm_fwd is called with another signature");
}

}  // namespace
}  // namespace mt::ops::test
