// Hand-computed checks of the row-wise argmax (ops/argmax.h), which has no backward, and its CUDA parity (exact).
#include "ops/argmax.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

Tensor rows_of(const std::vector<std::vector<double>>& rows, DType dtype) {
    const auto n = static_cast<int64_t>(rows.size()), v = static_cast<int64_t>(rows[0].size());
    Tensor t = Tensor::zeros({n, v}, DType::f64);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < v; ++j) core::tensor_set_flat(t, i * v + j, rows[i][j]);
    return t.to(dtype);
}

std::vector<int32_t> argmax_of(const Tensor& x) {
    const Tensor out = Tensor::zeros({x.size(0)}, DType::i32, x.device());
    argmax_rows(x, out);
    const Tensor host = out.to_device(core::Device::cpu);
    return {host.data<int32_t>(), host.data<int32_t>() + host.numel()};
}

// The rows every backend must answer alike: a plain maximum, ties (the first wins), NaN skipped, -inf rows, one column.
const std::vector<std::vector<double>> kCases = {
    {0.5, 2.0, -1.0, 1.5},
    {3.0, 3.0, 3.0, 3.0},          // all equal: the first
    {-2.0, 7.0, 1.0, 7.0},         // tie at 1 and 3
    {kNan, 1.0, kNan, 0.5},        // NaN is never the maximum
    {kNan, kNan, kNan, kNan},      // documented: 0
    {-kInf, -kInf, -kInf, -kInf},  // the first of the equal maxima
    {-kInf, kNan, -3.0, -kInf},    // the only finite value
    {-1.0, -0.5, kInf, kInf},      // +inf, tied
};
const std::vector<int32_t> kExpected = {1, 0, 1, 1, 0, 0, 2, 2};

void known_values() {
    for (const DType dtype : {DType::f32, DType::f64}) EXPECT_EQ(argmax_of(rows_of(kCases, dtype)), kExpected);
    EXPECT_EQ(argmax_of(rows_of({{4.0}, {-1.0}}, DType::f32)), (std::vector<int32_t>{0, 0}));  // V = 1
    // A long row whose maximum sits last and again (tied) in the middle.
    Tensor t = Tensor::zeros({1, 50021}, DType::f32);
    core::tensor_set_flat(t, 50020, 9.0);
    core::tensor_set_flat(t, 31337, 9.0);
    EXPECT_EQ(argmax_of(t), std::vector<int32_t>{31337});
}

// Bitwise the same for 1 and 3 threads over many rows, and the same as a plain loop.
void thread_count_invariant() {
    const Tensor x = op_randn({4099, 53}, 21, 0).to(DType::f32);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const std::vector<int32_t> one = argmax_of(x);
    omp_set_num_threads(3);
    const std::vector<int32_t> three = argmax_of(x);
    omp_set_num_threads(saved);
    EXPECT_EQ(one, three);
    for (int64_t i = 0; i < x.size(0); ++i) {
        int32_t best = 0;
        for (int64_t j = 1; j < x.size(1); ++j)
            if (core::tensor_get_flat(x, i * 53 + j) > core::tensor_get_flat(x, i * 53 + best))
                best = static_cast<int32_t>(j);
        ASSERT_EQ(one[static_cast<size_t>(i)], best) << "row " << i;
    }
}

void argument_errors() {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), out = Tensor::zeros({3}, DType::i32);
    argmax_rows(x, out);
    expect_op_error([&] { argmax_rows(x, Tensor::zeros({4}, DType::i32)); },
                    "argmax_rows: out has shape [4], expected [3]");
    expect_op_error([&] { argmax_rows(x, Tensor::zeros({3}, DType::f32)); },
                    "argmax_rows: out has dtype f32, expected i32");
    expect_op_error([&] { argmax_rows(Tensor::zeros({3, 0}, DType::f32), out); }, "a row must not be empty");
    expect_op_error([&] { argmax_rows(Tensor::zeros({12}, DType::f32), out); }, "argmax_rows: x has shape [12]");
    expect_op_error([&] { argmax_rows(x.to(DType::i32), out); }, "argmax_rows: x has dtype i32");
    expect_op_error(
        [&] {
            argmax_rows(op_noncontiguous({3, 4}, DType::f32), out);
        },
        "argmax_rows: x must be contiguous");
    expect_op_error([&] { argmax_rows(x, op_cuda_view({3}, DType::i32)); },
                    "argmax_rows: out is on cuda but x is on cpu");
}

// CUDA against the CPU, exactly: the hand-made rows, and random rows of a vocabulary-sized width in bf16 (coarse
// enough that ties across threads and warps occur) and f32, on the same rounded values.
void parity() {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        const Tensor hand = rows_of(kCases, dtype);
        const auto got = argmax_of(hand.to_device(core::Device::cuda));
        EXPECT_EQ(got, kExpected) << core::dtype_name(dtype);
        for (const int64_t v : {int64_t{1}, int64_t{50}, int64_t{257}, int64_t{32768 + 3}}) {
            const Tensor x = op_randn({131, v}, 22, static_cast<uint64_t>(v), 0.0, 3.0).to(dtype);
            const Tensor ref = Tensor::zeros({131}, DType::i32),
                         dev = Tensor::zeros({131}, DType::i32, core::Device::cuda);
            argmax_rows(x.to(DType::f32), ref);
            argmax_rows(x.to_device(core::Device::cuda), dev);
            op_expect_parity(fmt::format("argmax_rows_v{}_{}", v, core::dtype_name(dtype)),
                             "out",
                             dev.to_device(core::Device::cpu).to(DType::f64),
                             ref.to(DType::f64),
                             0.0);
        }
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_parity_check("argmax", "argmax_rows_exact", parity);
    op_register_check("argmax", "argmax_rows_known_values", known_values);
    op_register_check("argmax", "argmax_rows_thread_count_invariant", thread_count_invariant);
    op_register_check("argmax", "argmax_rows_argument_errors", argument_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
