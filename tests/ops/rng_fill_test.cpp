// Checks of the counter-based normal fill (ops/rng_fill.h), which has no backward: the CPU reference is
// core::rng_normal element by element (with an offset, in every dtype, for any thread count), and the CUDA fill
// equals it (f32: at most a few elements one ulp apart, where the devices' double log or cos differ in the last bit;
// bf16 and f16 likewise).
#include "ops/rng_fill.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "core/rng.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

constexpr uint64_t kSeed = 1234, kStream = 0x5eedf00dull, kOffset = 1000003;

// v rounded as the fill stores it: double -> f32 -> the 16-bit format.
double stored(double v, DType dtype) {
    const float f = static_cast<float>(v);
    switch (dtype) {
        case DType::f64:
            return v;
        case DType::bf16:
            return core::bf16_to_f32(core::f32_to_bf16(f));
        case DType::f16:
            return core::f16_to_f32(core::f32_to_f16(f));
        default:
            return f;
    }
}

void equals_core_draws() {
    for (const DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
        const Tensor t = Tensor::zeros({37, 11}, dtype);
        rng_fill_normal(t, kSeed, kStream, kOffset, 0.5, 0.02);
        for (int64_t i = 0; i < t.numel(); ++i) {
            const double want = 0.5 + 0.02 * core::rng_normal(kSeed, kStream, kOffset + static_cast<uint64_t>(i));
            ASSERT_EQ(core::tensor_get_flat(t, i), stored(want, dtype)) << core::dtype_name(dtype) << " element " << i;
        }
    }
}

void thread_count_invariant() {
    const Tensor one = Tensor::zeros({100003}, DType::f32), three = Tensor::zeros({100003}, DType::f32);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    rng_fill_normal(one, kSeed, kStream, 0, 0.0, 1.0);
    omp_set_num_threads(3);
    rng_fill_normal(three, kSeed, kStream, 0, 0.0, 1.0);
    omp_set_num_threads(saved);
    EXPECT_TRUE(op_same_bytes(one, three));
    // The draws look normal: mean ~ 0, variance ~ 1 over 1e5 samples (5 sigma bounds).
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < one.numel(); ++i) {
        const double v = core::tensor_get_flat(one, i);
        sum += v;
        sq += v * v;
    }
    const double n = static_cast<double>(one.numel()), mean = sum / n;
    EXPECT_LT(std::abs(mean), 5.0 / std::sqrt(n));
    EXPECT_LT(std::abs(sq / n - mean * mean - 1.0), 5.0 * std::sqrt(2.0 / n));
}

void argument_errors() {
    const Tensor t = Tensor::zeros({4}, DType::f32);
    expect_op_error([&] { rng_fill_normal(t, 1, 2, 0, 0.0, -1.0); }, "rng_fill_normal: mean 0 and std -1");
    expect_op_error([&] { rng_fill_normal(t, 1, 2, 0, NAN, 1.0); }, "must be finite");
    expect_op_error([&] { rng_fill_normal(Tensor::zeros({4}, DType::i32), 1, 2, 0, 0.0, 1.0); },
                    "rng_fill_normal: out has dtype i32");
    expect_op_error(
        [&] {
            rng_fill_normal(op_noncontiguous({3, 4}, DType::f32), 1, 2, 0, 0.0, 1.0);
        },
        "rng_fill_normal: out must be contiguous");
}

// The GPU fill against the CPU's, 2^20 + 3 elements at an offset: every element within one ulp of its dtype, at most
// 4 not bitwise equal (the expected count is about 2^20 / 2^28).
void parity() {
    const int64_t n = (int64_t{1} << 20) + 3;
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
        const Tensor ref = Tensor::zeros({n}, dtype), dev = Tensor::zeros({n}, dtype, core::Device::cuda);
        rng_fill_normal(ref, kSeed, kStream, kOffset, 0.0, 0.02);
        rng_fill_normal(dev, kSeed, kStream, kOffset, 0.0, 0.02);
        const Tensor got = dev.to_device(core::Device::cpu);
        int64_t differ = 0, far = 0;
        for (int64_t i = 0; i < n; ++i) {
            const double a = core::tensor_get_flat(got, i), b = core::tensor_get_flat(ref, i);
            if (a == b) continue;
            ++differ;
            const double ulp = dtype == DType::f32 ? std::abs(b) * 0x1.0p-23 : std::abs(b) * 0x1.0p-7;
            if (std::abs(a - b) > ulp) ++far;
        }
        EXPECT_LE(differ, 4) << core::dtype_name(dtype);
        EXPECT_EQ(far, 0) << core::dtype_name(dtype);
        op_expect_parity(fmt::format("rng_fill_normal_{}", core::dtype_name(dtype)), "out", got, ref, 1e-6);
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_parity_check("rng_fill", "rng_fill_normal_gpu_equals_cpu", parity);
    op_register_check("rng_fill", "rng_fill_normal_equals_core_draws", equals_core_draws);
    op_register_check("rng_fill", "rng_fill_normal_thread_count_invariant", thread_count_invariant);
    op_register_check("rng_fill", "rng_fill_normal_argument_errors", argument_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
