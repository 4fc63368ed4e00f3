// GPU checks of the grouped linear op's device kernel (ops/grouped_linear.h, gemm/grouped_gemm_sm90.cu) beyond the
// parity cases of grouped_linear_test.cpp (label gpu, skipped without a GPU; the device kernel's tests also skip off
// Hopper): the device kernel against the cuBLASLt path on the same bf16 inputs, two runs bitwise equal, an empty
// expert's dw left bitwise unchanged, and impl = device refusing what the kernel does not take.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "op_harness.h"
#include "ops/grouped_linear.h"

namespace mt::ops::test {
namespace {

using core::Device;

Tensor offsets_of(const std::vector<int32_t>& counts, Device device) {
    Tensor o = Tensor::zeros({static_cast<int64_t>(counts.size()) + 1}, DType::i32);
    int32_t acc = 0;
    for (size_t j = 0; j < counts.size(); ++j) core::tensor_set_flat(o, static_cast<int64_t>(j) + 1, acc += counts[j]);
    return o.to_device(device);
}

// The skip reason, or empty where the device kernel runs here.
std::string device_kernel_missing() {
    if (!op_gpu_available()) return kOpNoGpuMessage;
    const std::string why = grouped_linear_device_why_not(DType::bf16, DType::f32, 64, 64);
    return why.empty() ? std::string() : "the device grouped GEMM does not run here: " + why;
}

// One problem in bf16 on the device, and the outputs of one implementation.
struct Problem {
    std::vector<int32_t> counts;
    int64_t k = 0, m = 0;
    Tensor x, w, dy, offsets;
};
struct Result {
    Tensor y, dx, dw;
};

Problem make_problem(const std::vector<int32_t>& counts, int64_t k, int64_t m, uint64_t seed) {
    int64_t rows = 0;
    for (int32_t c : counts) rows += c;
    const int64_t e = static_cast<int64_t>(counts.size());
    auto dev = [](const Tensor& t) { return t.to(DType::bf16).to_device(Device::cuda); };
    return {counts,
            k,
            m,
            dev(op_randn({rows, k}, seed, 0)),
            dev(op_randn({e, m, k}, seed, 1, 0.0, 0.05)),
            dev(op_randn({rows, m}, seed, 2)),
            offsets_of(counts, Device::cuda)};
}

// y, then dx written (gate) and accumulated (up, the MoE layer's order), dw accumulated onto a seeded prefill in
// dw_dtype. cublaslt: the offsets go as a host tensor, as the MoE layer's copy.
Result run(const Problem& p, GroupedGemm impl, DType dw_dtype) {
    const Tensor o = impl == GroupedGemm::cublaslt ? p.offsets.to_device(Device::cpu) : p.offsets;
    Result r;
    r.y = Tensor::zeros({p.x.size(0), p.m}, DType::bf16, Device::cuda);
    r.dx = Tensor::zeros(p.x.shape(), DType::bf16, Device::cuda);
    r.dw = op_randn(p.w.shape(), 7, 3, 0.0, 0.5).to(dw_dtype).to_device(Device::cuda);
    grouped_linear_fwd(p.x, p.w, o, r.y, impl);
    grouped_linear_bwd(p.x, p.w, o, p.dy, r.dx, r.dw, false, impl);
    grouped_linear_bwd(p.x, p.w, o, p.dy, r.dx, r.dw, true, impl);
    return r;
}

struct Case {
    std::vector<int32_t> counts;
    int64_t k, m;
};

std::vector<Case> cases() {
    std::vector<int32_t> mixed;
    for (int j = 0; j < 257; ++j) mixed.push_back(static_cast<int32_t>((j * 37) % 131) * (j % 5 != 0));
    std::vector<int32_t> big(64, 0);
    big[5] = 4099;
    return {{{1}, 72, 64}, {{0, 131, 1}, 256, 1536}, {mixed, 1536, 72}, {big, 72, 256}, {{2, 0, 3000}, 64, 2048}};
}

std::string name_of(const Case& s) {
    return fmt::format("E{} K{} M{}", s.counts.size(), s.k, s.m);
}

// Both implementations sum bf16 products in f32 in their own orders: the same result within the bf16 budget.
TEST(GpuGroupedLinear, DeviceMatchesCublasLt) {
    if (const std::string why = device_kernel_missing(); !why.empty()) GTEST_SKIP() << why;
    for (const Case& s : cases())
        for (DType dw_dtype : {DType::f32, DType::bf16}) {
            const Problem p = make_problem(s.counts, s.k, s.m, 11);
            const Result dev = run(p, GroupedGemm::device, dw_dtype), lt = run(p, GroupedGemm::cublaslt, dw_dtype);
            const std::string what = fmt::format("{} dw {}", name_of(s), core::dtype_name(dw_dtype));
            op_expect_parity("device_vs_cublaslt", what + " y", dev.y, lt.y, 1e-2);
            op_expect_parity("device_vs_cublaslt", what + " dx", dev.dx, lt.dx, 1e-2);
            op_expect_parity("device_vs_cublaslt", what + " dw", dev.dw, lt.dw, 1e-2);
        }
}

// No atomics, a fixed order over each expert's rows: two runs give the same bits.
TEST(GpuGroupedLinear, DeviceRunTwiceBitwise) {
    if (const std::string why = device_kernel_missing(); !why.empty()) GTEST_SKIP() << why;
    for (const Case& s : cases()) {
        const Problem p = make_problem(s.counts, s.k, s.m, 12);
        const Result a = run(p, GroupedGemm::device, DType::f32), b = run(p, GroupedGemm::device, DType::f32);
        EXPECT_TRUE(op_same_bytes(a.y, b.y)) << name_of(s) << ": y differs between two runs";
        EXPECT_TRUE(op_same_bytes(a.dx, b.dx)) << name_of(s) << ": dx differs between two runs";
        EXPECT_TRUE(op_same_bytes(a.dw, b.dw)) << name_of(s) << ": dw differs between two runs";
    }
}

// An empty expert's dw keeps its bits (bf16 and f32), and every row of y belongs to its own expert: y rows of
// expert 2 equal a run with expert 2 alone.
TEST(GpuGroupedLinear, DeviceEmptyExpertUntouched) {
    if (const std::string why = device_kernel_missing(); !why.empty()) GTEST_SKIP() << why;
    for (DType dw_dtype : {DType::f32, DType::bf16}) {
        const Problem p = make_problem({5, 0, 130, 0}, 72, 136, 13);
        const Tensor before = op_randn(p.w.shape(), 7, 3, 0.0, 0.5).to(dw_dtype);
        const Result r = run(p, GroupedGemm::device, dw_dtype);
        const Tensor after = r.dw.to_device(Device::cpu);
        for (int64_t j : {1, 3})
            EXPECT_TRUE(op_same_bytes(after.select(0, j), before.select(0, j)))
                << "dw of empty expert " << j << " changed (" << core::dtype_name(dw_dtype) << ")";
        const Problem alone = {{130},
                               72,
                               136,
                               p.x.slice(0, 5, 135),
                               p.w.slice(0, 2, 3),
                               p.dy.slice(0, 5, 135),
                               offsets_of({130}, Device::cuda)};
        const Tensor y = Tensor::zeros({130, 136}, DType::bf16, Device::cuda);
        grouped_linear_fwd(alone.x, alone.w, alone.offsets, y, GroupedGemm::device);
        EXPECT_TRUE(op_same_bytes(y, r.y.slice(0, 5, 135))) << "expert 2's rows depend on the other experts";
    }
}

// accumulate_dw false, both implementations: dw written over NaN has the bits of the sum into zeros (the same
// kernel, the add of zero left out), and the empty experts' dw are zeros.
TEST(GpuGroupedLinear, WrittenDwEqualsTheSumIntoZeros) {
    if (const std::string why = device_kernel_missing(); !why.empty()) GTEST_SKIP() << why;
    for (const GroupedGemm impl : {GroupedGemm::device, GroupedGemm::cublaslt})
        for (DType dw_dtype : {DType::f32, DType::bf16}) {
            const Problem p = make_problem({5, 0, 130, 0, 300}, 72, 136, 14);
            const Tensor o = impl == GroupedGemm::cublaslt ? p.offsets.to_device(Device::cpu) : p.offsets;
            const Tensor added = Tensor::zeros(p.w.shape(), dw_dtype, Device::cuda);
            const Tensor written = Tensor::zeros(p.w.shape(), dw_dtype, Device::cuda);
            written.fill(std::nan(""));
            grouped_linear_bwd(p.x, p.w, o, p.dy, Tensor(), added, false, impl);
            grouped_linear_bwd(p.x, p.w, o, p.dy, Tensor(), written, false, impl, /*accumulate_dw=*/false);
            EXPECT_TRUE(op_same_bytes(added, written))
                << (impl == GroupedGemm::device ? "device" : "cublaslt") << ", dw " << core::dtype_name(dw_dtype);
        }
}

// impl = device fails, naming why, where the kernel does not apply; automatic falls back to cuBLASLt there.
TEST(GpuGroupedLinear, DeviceRefusesWhatItDoesNotTake) {
    if (const std::string why = device_kernel_missing(); !why.empty()) GTEST_SKIP() << why;
    const Problem p = make_problem({3, 4}, 64, 64, 14);
    const Tensor y = Tensor::zeros({7, 64}, DType::bf16, Device::cuda);
    expect_op_error([&] { grouped_linear_fwd(p.x, p.w, p.offsets.to_device(Device::cpu), y, GroupedGemm::device); },
                    "grouped_linear_fwd: the device grouped GEMM cannot run: offsets are not a cuda tensor");
    const Tensor x32 = p.x.to(DType::f32), w32 = p.w.to(DType::f32), y32 = y.to(DType::f32);
    expect_op_error([&] { grouped_linear_fwd(x32, w32, p.offsets, y32, GroupedGemm::device); },
                    "x is f32, the device kernel takes bf16");
    const Tensor x12 = Tensor::zeros({7, 12}, DType::bf16, Device::cuda);
    const Tensor w12 = Tensor::zeros({2, 64, 12}, DType::bf16, Device::cuda);
    expect_op_error([&] { grouped_linear_fwd(x12, w12, p.offsets, y, GroupedGemm::device); },
                    "K = 12 and M = 64 must be positive multiples of 8");
    grouped_linear_fwd(x32, w32, p.offsets, y32);  // automatic: cuBLASLt after a host copy of the offsets
    grouped_linear_fwd(x12, w12, p.offsets, y);
}

}  // namespace
}  // namespace mt::ops::test
