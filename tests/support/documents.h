// Test helpers of document masking (long_context.md §2): a document-start map written from each row's document
// starts, and a document's rows of a [B, T, ...] tensor as a batch of one, to run the document alone.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt::testing {

// starts[b]: the first positions of row b's documents (starting with 0); the map is [starts.size(), t] i32.
inline core::Tensor doc_start_map(const std::vector<std::vector<int64_t>>& starts, int64_t t) {
    const int64_t b = static_cast<int64_t>(starts.size());
    core::Tensor ds = core::Tensor::zeros({b, t}, core::DType::i32);
    for (int64_t row = 0; row < b; ++row)
        for (int64_t i = 0, start = 0; i < t; ++i) {
            for (int64_t s : starts[static_cast<size_t>(row)])
                if (s == i) start = s;
            core::tensor_set_flat(ds, row * t + i, static_cast<double>(start));
        }
    return ds;
}

// Tokens [first, end) of row b of x [B, T, ...] as [1, end - first, ...] (a copy).
inline core::Tensor doc_rows(const core::Tensor& x, int64_t b, int64_t first, int64_t end) {
    core::Shape shape = x.shape();
    shape[0] = 1;
    shape[1] = end - first;
    return x.select(0, b).slice(0, first, end).clone().reshape(shape);
}

}  // namespace mt::testing
