// Tensor views, conversion and the Philox RNG.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/rng.h"

using namespace mt::core;

TEST(Tensor, ViewsShareStorage) {
    Tensor t = Tensor::zeros({2, 3, 4}, DType::f32);
    Tensor s = t.select(1, 2);
    EXPECT_EQ(s.shape(), (Shape{2, 4}));
    s.fill(7.0);
    EXPECT_EQ(t.at({1, 2, 3}), 7.0);
    EXPECT_EQ(t.at({1, 1, 3}), 0.0);
    Tensor r = t.reshape({6, 4});
    EXPECT_EQ(r.at({5, 3}), 7.0);
    EXPECT_FALSE(s.is_contiguous());
    Tensor c = s.clone();
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.at({1, 3}), 7.0);
}

TEST(Tensor, ConvertsDtypes) {
    Tensor t = Tensor::zeros({3}, DType::f32);
    tensor_set_flat(t, 0, 1.5);
    tensor_set_flat(t, 1, -2.25);
    tensor_set_flat(t, 2, 3.0e-3);
    for (DType d : {DType::f64, DType::bf16, DType::f16}) {
        Tensor u = t.to(d).to(DType::f32);
        EXPECT_EQ(u.at({0}), 1.5);
        EXPECT_EQ(u.at({1}), -2.25);
        EXPECT_NEAR(u.at({2}), 3.0e-3, 3.0e-3 * 1e-2);
    }
}

TEST(Tensor, BadViewsAreErrors) {
    Tensor t = Tensor::zeros({2, 3}, DType::f32);
    EXPECT_THROW(t.reshape({4, 2}), Error);
    EXPECT_THROW(t.slice(1, 2, 5), Error);
    EXPECT_THROW(t.data<double>(), Error);
}

TEST(Rng, PhiloxIsCounterBased) {
    // Known-answer test from the Random123 distribution (philox4x32-10, counter 0, key 0).
    auto b = philox4x32(0, 0, 0);
    EXPECT_EQ(b[0], 0x6627e8d5u);
    EXPECT_EQ(b[1], 0xe169c58du);
    EXPECT_EQ(b[2], 0xbc57ac4cu);
    EXPECT_EQ(b[3], 0x9b00dbd8u);
    EXPECT_EQ(rng_normal(1, 2, 3), rng_normal(1, 2, 3));
    EXPECT_NE(rng_normal(1, 2, 3), rng_normal(1, 3, 3));
    double mean = 0, sq = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
        const double x = rng_normal(7, 0, static_cast<uint64_t>(i));
        mean += x;
        sq += x * x;
    }
    mean /= n;
    EXPECT_NEAR(mean, 0.0, 0.03);
    EXPECT_NEAR(sq / n, 1.0, 0.04);
}

// A strided view of device memory (a column slice) reaches the host and converts dtypes through copy_from, as a host
// view does: Tensor::on_host copies the bytes it spans once under the same strides (a to_device of the view would
// recurse through copy_from).
TEST(GpuTensor, StridedDeviceViewsCopyToTheHost) {
    if (!backend_available(Device::cuda)) GTEST_SKIP() << "no CUDA device";
    const Tensor host = Tensor::zeros({5, 7}, DType::f32);
    for (int64_t i = 0; i < host.numel(); ++i) tensor_set_flat(host, i, static_cast<double>(i) * 0.5);
    const Tensor dev = host.to_device(Device::cuda);
    const Tensor cols = dev.slice(1, 2, 6);  // [5, 4], row stride 7
    ASSERT_FALSE(cols.is_contiguous());
    const Tensor back = cols.on_host();
    EXPECT_EQ(back.device(), Device::cpu);
    Tensor wide = Tensor::zeros({5, 4}, DType::f64), dev_copy = Tensor::zeros({5, 4}, DType::bf16, Device::cuda);
    wide.copy_from(cols);      // device view -> host, f32 -> f64
    dev_copy.copy_from(cols);  // device view -> contiguous device, f32 -> bf16 (through the host)
    const Tensor dev_back = dev_copy.to_device(Device::cpu);
    for (int64_t r = 0; r < 5; ++r)
        for (int64_t c = 0; c < 4; ++c) {
            const double want = static_cast<double>(r * 7 + c + 2) * 0.5;
            EXPECT_EQ(back.at({r, c}), want);
            EXPECT_EQ(wide.at({r, c}), want);
            EXPECT_EQ(dev_back.at({r, c}), want);  // halves of integers below 18 are exact in bf16
        }
}
