// Central finite differences of a scalar loss at chosen entries of its inputs, against the analytic gradients: the
// check the op tests write for ops composed outside the op harness (document masking, window attention).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mt::testing {

// For each (input, its gradient) and each entry entries(input numel) returns: (loss(x + h) - loss(x - h)) / 2h with
// h = 1e-6 against the gradient, to 1e-6 relative (absolute below 1). The input is restored. Returns the entries
// checked.
inline int expect_central_differences(const std::function<double()>& loss,
                                      std::initializer_list<std::pair<core::Tensor*, const core::Tensor*>> params,
                                      const std::function<std::vector<int64_t>(int64_t)>& entries) {
    int checked = 0;
    for (const auto& [x, grad] : params)
        for (int64_t i : entries(x->numel())) {
            const double x0 = core::tensor_get_flat(*x, i), h = 1e-6;
            core::tensor_set_flat(*x, i, x0 + h);
            const double up = loss();
            core::tensor_set_flat(*x, i, x0 - h);
            const double down = loss();
            core::tensor_set_flat(*x, i, x0);
            const double numeric = (up - down) / (2 * h), analytic = core::tensor_get_flat(*grad, i);
            EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "element " << i;
            ++checked;
        }
    return checked;
}

}  // namespace mt::testing
