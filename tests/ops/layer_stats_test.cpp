// Checks of the per-layer statistics (ops/layer_stats.h), which have no backward: sums against loops written here,
// accumulation into the slots, thread-count invariance, argument errors, and CPU-vs-CUDA parity (label gpu).
#include "ops/layer_stats.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

Tensor slots(int64_t n) {
    return Tensor::zeros({n}, DType::f64);
}

double at(const Tensor& t, int64_t i) {
    return core::tensor_get_flat(t, i);
}

// Two calls add up: {count, sum, sum of squares, count at or below low}, against a loop over the values.
void moments_known_values() {
    const Tensor x = op_randn({3, 10007}, 21, 0).to(DType::f32);  // several blocks, not a multiple of the block
    const Tensor out = slots(4);
    layer_stats_moments(x, -0.5, out);
    layer_stats_moments(x.slice(0, 0, 1), -0.5, out);
    double sum = 0, sq = 0, below = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
        const double v = at(x, i), w = i < 10007 ? 2.0 : 1.0;  // row 0 counted twice
        sum += w * v, sq += w * v * v, below += v <= -0.5 ? w : 0.0;
    }
    EXPECT_EQ(at(out, 0), 4.0 * 10007);
    EXPECT_NEAR(at(out, 1), sum, 1e-10 * std::sqrt(sq));
    EXPECT_NEAR(at(out, 2), sq, 1e-12 * sq);
    EXPECT_EQ(at(out, 3), below);
    EXPECT_GT(below, 0.0);
}

// Column sums and the entropy sum of softmax rows, against a loop; a one-hot row has entropy 0, a uniform one ln m.
void mix_known_values() {
    const int64_t rows = 5003, m = 5;
    Tensor alpha = op_randn({rows, m}, 22, 0).to(DType::f64);
    for (int64_t r = 0; r < rows; ++r) {
        double z = 0;
        for (int64_t j = 0; j < m; ++j) z += std::exp(at(alpha, r * m + j));
        for (int64_t j = 0; j < m; ++j) core::tensor_set_flat(alpha, r * m + j, std::exp(at(alpha, r * m + j)) / z);
    }
    for (int64_t j = 0; j < m; ++j) core::tensor_set_flat(alpha, j, j == 2 ? 1.0 : 0.0);  // row 0: one-hot
    for (int64_t j = 0; j < m; ++j) core::tensor_set_flat(alpha, m + j, 1.0 / m);         // row 1: uniform
    const Tensor out = slots(m + 2);
    layer_stats_mix(alpha, out);
    std::vector<double> col(m, 0.0);
    double entropy = 0;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < m; ++j) {
            const double a = at(alpha, r * m + j);
            col[static_cast<size_t>(j)] += a;
            entropy -= a > 0 ? a * std::log(a) : 0.0;
        }
    EXPECT_EQ(at(out, 0), static_cast<double>(rows));
    for (int64_t j = 0; j < m; ++j) EXPECT_NEAR(at(out, 1 + j), col[static_cast<size_t>(j)], 1e-10) << j;
    EXPECT_NEAR(at(out, m + 1), entropy, 1e-9);
    const Tensor two = slots(m + 2);
    layer_stats_mix(alpha.slice(0, 0, 2), two);
    EXPECT_NEAR(at(two, m + 1), std::log(static_cast<double>(m)), 1e-15);
}

// Bitwise the same for 1 and 3 threads.
void thread_count_invariant() {
    const Tensor x = op_randn({200003}, 23, 0).to(DType::f32);
    const Tensor alpha = op_uniform({70001, 3}, 23, 1, 0.0, 1.0).to(DType::f32);
    const int saved = omp_get_max_threads();
    Tensor a = slots(4), b = slots(4), c = slots(5), d = slots(5);
    omp_set_num_threads(1);
    layer_stats_moments(x, 0.0, a);
    layer_stats_mix(alpha, c);
    omp_set_num_threads(3);
    layer_stats_moments(x, 0.0, b);
    layer_stats_mix(alpha, d);
    omp_set_num_threads(saved);
    EXPECT_TRUE(op_same_bytes(a, b));
    EXPECT_TRUE(op_same_bytes(c, d));
}

void argument_errors() {
    const Tensor x = Tensor::zeros({2, 3}, DType::f32);
    expect_op_error([&] { layer_stats_moments(x, 0.0, slots(3)); }, "layer_stats_moments: out has shape [3]");
    expect_op_error([&] { layer_stats_moments(x, 0.0, Tensor::zeros({4}, DType::f32)); },
                    "layer_stats_moments: out has dtype f32, expected f64");
    expect_op_error(
        [&] {
            layer_stats_moments(op_noncontiguous({2, 3}, DType::f32), 0.0, slots(4));
        },
        "layer_stats_moments: x must be contiguous");
    expect_op_error([&] { layer_stats_mix(x, slots(4)); }, "layer_stats_mix: out has shape [4]");
    expect_op_error([&] { layer_stats_mix(Tensor::zeros({6}, DType::f32), slots(8)); }, "layer_stats_mix: alpha");
    expect_op_error(
        [&] {
            layer_stats_mix(Tensor::zeros({2, 33}, DType::f32), slots(35));
        },
        "layer_stats_mix: alpha has 33 sources, expected 1 to 32");
    expect_op_error(
        [&] {
            layer_stats_moments(op_cuda_view({2, 3}, DType::f32), 0.0, slots(4));
        },
        "layer_stats_moments: out is on cpu but x is on cuda");
}

// CUDA against the CPU: odd sizes and several chunks, bf16 and f32 inputs (the CPU sees the same rounded values),
// accumulation over two calls, and bitwise-equal repeats (fixed-order sums, no atomics).
void parity() {
    for (const int64_t n : {int64_t{1}, int64_t{4097}, int64_t{1000003}}) {
        for (const DType dtype : {DType::f32, DType::bf16}) {
            const Tensor x = op_randn({n}, 24, static_cast<uint64_t>(n), 0.1, 2.0).to(dtype);
            const Tensor ref = slots(4), dev = slots(4).to_device(core::Device::cuda);
            for (int k = 0; k < 2; ++k) {
                layer_stats_moments(x.to(DType::f32), -1.0, ref);
                layer_stats_moments(x.to_device(core::Device::cuda), -1.0, dev);
            }
            op_expect_parity(
                "layer_stats_moments", fmt::format("n {} {}", n, core::dtype_name(dtype)), dev, ref, 1e-12);
            const Tensor again = slots(4).to_device(core::Device::cuda);
            layer_stats_moments(x.to_device(core::Device::cuda), -1.0, again);
            layer_stats_moments(x.to_device(core::Device::cuda), -1.0, again);
            EXPECT_TRUE(op_same_bytes(again, dev)) << "two CUDA runs differ";
        }
    }
    for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{32}}) {
        const Tensor alpha = op_uniform({3001, m}, 25, static_cast<uint64_t>(m), 0.0, 1.0).to(DType::f32);
        const Tensor ref = slots(m + 2), dev = slots(m + 2).to_device(core::Device::cuda);
        layer_stats_mix(alpha, ref);
        layer_stats_mix(alpha.to_device(core::Device::cuda), dev);
        op_expect_parity("layer_stats_mix", fmt::format("m {}", m), dev, ref, 1e-12);
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_parity_check("layer_stats", "layer_stats_cpu_vs_cuda", parity);
    op_register_check("layer_stats", "layer_stats_moments_known_values", moments_known_values);
    op_register_check("layer_stats", "layer_stats_mix_known_values", mix_known_values);
    op_register_check("layer_stats", "layer_stats_thread_count_invariant", thread_count_invariant);
    op_register_check("layer_stats", "layer_stats_argument_errors", argument_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
