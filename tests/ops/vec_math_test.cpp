// The vectorized exp and max behind the f32 softmax loops (src/ops/cpu/vec_math.h).
#include "ops/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace mt::ops::cpu {
namespace {

TEST(OpVecMath, ExpIsWithinTwoUlp) {
    std::vector<float> x;
    for (double v = -87.0; v < 88.3; v += 0.000731) x.push_back(static_cast<float>(v));
    std::vector<float> y(x.size());
    exp_affine(x.data(), y.data(), static_cast<int64_t>(x.size()), 1.0f, 0.0f);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double ref = std::exp(static_cast<double>(x[i]));
        worst = std::max(worst, std::fabs(y[i] - ref) / ref);
    }
    EXPECT_LT(worst, 2 * std::numeric_limits<float>::epsilon());
}

TEST(OpVecMath, ExpEdgesAndAffineArgument) {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {0.0f, 1.0f, -100.0f, -inf, 100.0f, std::nanf(""), 2.0f};
    std::vector<float> y(x.size());
    exp_affine(x.data(), y.data(), static_cast<int64_t>(x.size()), 1.0f, 0.0f);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_NEAR(y[1], std::exp(1.0), 1e-6);
    EXPECT_EQ(y[2], 0.0f);
    EXPECT_EQ(y[3], 0.0f);
    EXPECT_TRUE(std::isfinite(y[4]) && y[4] > 1e38f);
    EXPECT_TRUE(std::isnan(y[5]));
    // a x + b: exp(-2 * 2 + 1) = exp(-3), in place.
    std::vector<float> z = {2.0f};
    exp_affine(z.data(), z.data(), 1, -2.0f, 1.0f);
    EXPECT_NEAR(z[0], std::exp(-3.0), 1e-8);
}

// An element's result does not depend on its position (vector body or padded tail) or on the array length.
TEST(OpVecMath, ExpIsPositionIndependent) {
    std::vector<float> x(37);
    for (size_t i = 0; i < x.size(); ++i) x[i] = -3.0f + 0.37f * static_cast<float>(i);
    std::vector<float> full(x.size());
    exp_affine(x.data(), full.data(), static_cast<int64_t>(x.size()), 1.0f, -0.5f);
    for (int64_t start = 0; start < 9; ++start) {
        for (int64_t len = 1; start + len <= 37; len += 5) {
            std::vector<float> part(static_cast<size_t>(len));
            exp_affine(x.data() + start, part.data(), len, 1.0f, -0.5f);
            for (int64_t i = 0; i < len; ++i) EXPECT_EQ(part[i], full[start + i]) << start << " " << len << " " << i;
        }
    }
}

TEST(OpVecMath, MaxValue) {
    std::vector<float> x(29);
    for (size_t i = 0; i < x.size(); ++i) x[i] = -static_cast<float>((i * 7) % 29);
    for (int64_t n = 1; n <= 29; ++n) {
        float ref = x[0];
        for (int64_t i = 1; i < n; ++i) ref = std::max(ref, x[i]);
        EXPECT_EQ(max_value(x.data(), n), ref) << n;
    }
    x[17] = 5.0f;
    EXPECT_EQ(max_value(x.data(), 29), 5.0f);
    const std::vector<double> d = {-1.0, -0.5, -2.0};
    EXPECT_EQ(max_value(d.data(), 3), -0.5);
}

}  // namespace
}  // namespace mt::ops::cpu
