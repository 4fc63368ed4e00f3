// Hand-computed checks of the global L2 norm (ops/global_norm.h), which has no backward.
#include "ops/global_norm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

void known_values() {
    Tensor a = Tensor::zeros({2}, DType::f32), b = Tensor::zeros({1, 1, 1}, DType::f64);
    core::tensor_set_flat(a, 0, 3.0);
    core::tensor_set_flat(a, 1, -4.0);
    core::tensor_set_flat(b, 0, 12.0);
    EXPECT_EQ(global_norm_sq(a), 25.0);
    EXPECT_EQ(global_norm({a}), 5.0);
    EXPECT_EQ(global_norm({a, b}), 13.0);  // sqrt(9 + 16 + 144), f32 and f64 tensors together
    EXPECT_EQ(global_norm({}), 0.0);
    EXPECT_EQ(global_norm({Tensor::zeros({0}, DType::f32)}), 0.0);
    Tensor ones = Tensor::zeros({3, 10007}, DType::f32);  // many blocks, not a multiple of the block size
    ones.fill(1.0);
    EXPECT_EQ(global_norm_sq(ones), 30021.0);
    EXPECT_EQ(global_norm({ones, ones, ones, a}), std::sqrt(3.0 * 30021.0 + 25.0));
}

// The sum is in f64 over f32 values: 1e8 + 1 + ... survives where an f32 accumulator would lose the small terms.
void accumulates_in_f64() {
    Tensor t = Tensor::zeros({5000}, DType::f32);
    t.fill(1.0);
    core::tensor_set_flat(t, 0, 1e4);  // 1e8 after squaring
    EXPECT_EQ(global_norm_sq(t), 1e8 + 4999.0);
}

// Bitwise the same for 1 and 3 threads over several blocks.
void thread_count_invariant() {
    const Tensor t = op_randn({100003}, 11, 0).to(DType::f32);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const double one = global_norm({t, t});
    omp_set_num_threads(3);
    const double three = global_norm({t, t});
    omp_set_num_threads(saved);
    EXPECT_EQ(one, three);
    double ref = 0;
    for (int64_t i = 0; i < t.numel(); ++i) ref += core::tensor_get_flat(t, i) * core::tensor_get_flat(t, i);
    EXPECT_NEAR(one, std::sqrt(2 * ref), 1e-12 * one);
}

void argument_errors() {
    const Tensor a = Tensor::zeros({2, 3}, DType::f32);
    expect_op_error(
        [&] {
            global_norm({a, op_noncontiguous({2, 3}, DType::f32)});
        },
        "global_norm: tensors[1] must be contiguous");
    expect_op_error(
        [&] {
            global_norm({a, Tensor::zeros({2}, DType::i32)});
        },
        "global_norm: tensors[1] has dtype i32, expected f32 or f64");
    expect_op_error([&] { global_norm({Tensor()}); }, "global_norm: tensors[0] is undefined");
    expect_op_error([&] { global_norm_sq(a.to(DType::bf16)); }, "global_norm_sq: t has dtype bf16");
    expect_op_error(
        [&] {
            global_norm({a, op_cuda_view({2, 3}, DType::f32)});
        },
        "global_norm: tensors[1] is on cuda but tensors[0] is on cpu");
}

// CUDA against the CPU over a list of f32 and bf16 tensors of odd sizes (the CPU sees the same rounded values), the
// one-tensor global_norm_sq, an empty tensor, and bitwise-equal repeats (a fixed-order reduction).
void parity() {
    const std::vector<int64_t> sizes = {1, 7, 4097, 65536, 1000003, 0, 3 * 1048576 + 5};
    std::vector<Tensor> cpu, dev;
    for (size_t i = 0; i < sizes.size(); ++i) {
        const DType dtype = i % 2 == 0 ? DType::f32 : DType::bf16;
        const Tensor t = op_randn({sizes[i]}, 13, i, 0.0, 1.0 + static_cast<double>(i)).to(dtype);
        cpu.push_back(t.to(DType::f32));
        dev.push_back(t.to_device(core::Device::cuda));
    }
    const auto scalar = [](double x) {
        Tensor t = Tensor::zeros({1}, DType::f64);
        core::tensor_set_flat(t, 0, x);
        return t;
    };
    const double got = global_norm(dev), ref = global_norm(cpu);
    op_expect_parity("global_norm_mixed", "norm", scalar(got), scalar(ref), 1e-12);
    EXPECT_EQ(global_norm(dev), got) << "two CUDA runs differ";
    op_expect_parity("global_norm_mixed",
                     "norm_sq of tensors[4]",
                     scalar(global_norm_sq(dev[4])),
                     scalar(global_norm_sq(cpu[4])),
                     1e-12);
    EXPECT_EQ(global_norm({dev[5]}), 0.0);
    const std::vector<Tensor> one = {dev[0]};
    op_expect_parity(
        "global_norm_mixed", "norm of tensors[0]", scalar(global_norm(one)), scalar(global_norm({cpu[0]})), 1e-12);
}

// Groups: each group's sum equals the sum of squares of its tensors alone; groups may be empty; errors name the id.
void grouped_known_values() {
    const Tensor a = Tensor::zeros({2}, DType::f32), b = Tensor::zeros({3}, DType::f64);
    a.fill(2.0);  // 8
    b.fill(3.0);  // 27
    const std::vector<double> sq = global_norms_sq({a, b, a, b}, {1, 0, 1, 2}, 4);
    EXPECT_EQ(sq, (std::vector<double>{27.0, 16.0, 27.0, 0.0}));
    EXPECT_TRUE(global_norms_sq({}, {}, 0).empty());
    expect_op_error([&] { global_norms_sq({a}, {0, 1}, 2); }, "global_norms_sq: 2 group ids for 1 tensors");
    expect_op_error([&] { global_norms_sq({a, b}, {0, 2}, 2); }, "global_norms_sq: group[1] = 2 is not in [0, 2)");
}

// CUDA groups against the CPU, with tensors of three dtypes, odd sizes and slices that start off 16-byte alignment
// (the scalar path); each group's sum is bitwise the sum of its tensors taken alone, and repeats are bitwise equal.
void grouped_parity() {
    const std::vector<int64_t> sizes = {5, 65536 + 3, 1, 3 * 65536, 1000003, 9, 2 * 65536 + 17};
    const std::vector<int> group = {2, 0, 2, 1, 0, 3, 0};
    const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
    std::vector<Tensor> cpu, dev;
    for (size_t i = 0; i < sizes.size(); ++i) {
        const DType dtype = dtypes[i % 3];
        // Every other tensor is a slice starting 3 elements into a larger one: not 16-byte aligned.
        const int64_t skip = i % 2 == 1 ? 3 : 0;
        const Tensor t = op_randn({sizes[i] + skip}, 17, i, 0.0, 0.5 + static_cast<double>(i)).to(dtype);
        const Tensor d = t.to_device(core::Device::cuda).slice(0, skip, skip + sizes[i]);
        cpu.push_back(t.slice(0, skip, skip + sizes[i]).to(DType::f32));
        dev.push_back(d);
    }
    const std::vector<double> got = global_norms_sq(dev, group, 5), ref = global_norms_sq(cpu, group, 5);
    ASSERT_EQ(got.size(), 5u);
    EXPECT_EQ(got[4], 0.0);
    for (int g = 0; g < 4; ++g) {
        Tensor a = Tensor::zeros({1}, DType::f64), b = Tensor::zeros({1}, DType::f64);
        core::tensor_set_flat(a, 0, got[static_cast<size_t>(g)]);
        core::tensor_set_flat(b, 0, ref[static_cast<size_t>(g)]);
        op_expect_parity(fmt::format("global_norms_sq_group{}", g), "sum of squares", a, b, 1e-12);
        std::vector<Tensor> alone;
        for (size_t i = 0; i < dev.size(); ++i)
            if (group[i] == g) alone.push_back(dev[i]);
        EXPECT_EQ(global_norms_sq(alone, std::vector<int>(alone.size(), 0), 1)[0], got[static_cast<size_t>(g)])
            << "group " << g;
    }
    EXPECT_EQ(global_norms_sq(dev, group, 5), got) << "two CUDA runs differ";
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_parity_check("global_norm", "global_norm_mixed_dtypes", parity);
    op_register_parity_check("global_norm", "global_norms_sq_groups", grouped_parity);
    op_register_check("global_norm", "global_norms_sq_known_values", grouped_known_values);
    op_register_check("global_norm", "global_norm_known_values", known_values);
    op_register_check("global_norm", "global_norm_accumulates_in_f64", accumulates_in_f64);
    op_register_check("global_norm", "global_norm_thread_count_invariant", thread_count_invariant);
    op_register_check("global_norm", "global_norm_argument_errors", argument_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
