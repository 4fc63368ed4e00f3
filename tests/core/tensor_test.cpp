// Tensor views, conversion and the Philox RNG.
#include "core/tensor.h"

#include <gtest/gtest.h>

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
