// rho, the relative L2 distance the specs' tolerances are written in: ||a - b|| / ||b|| over every element (the
// absolute distance when b is all zeros). Host tensors of any float dtype, the same number of elements.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor.h"

namespace mt::testing {

inline double rho(const core::Tensor& a, const core::Tensor& b) {
    EXPECT_EQ(a.numel(), b.numel());
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < a.numel() && i < b.numel(); ++i) {
        const double x = core::tensor_get_flat(a, i), y = core::tensor_get_flat(b, i);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace mt::testing
