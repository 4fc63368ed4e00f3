// Document masking on the CPU by splitting (ops/kda.cpp, ops/causal_conv1d.cpp): the documents of a document-start
// map (AttentionMask::doc_start, ops/attention.h) as spans of rows, and a span's rows of a [B, T, ...] tensor, so an
// entry point can run its kernel on each document as its own sequence. Exact for any kernel; a reference, not a fast
// path (every span is a copy).
#pragma once

#include <vector>

#include "ops/op_common.h"

namespace mt::ops::cpu {

// Tokens [first, end) of row `row`: one document.
struct DocSpan {
    int64_t row, first, end;
};

// The documents of a checked map ([B, T] i32, cpu::check_doc_start), row by row in order.
inline std::vector<DocSpan> doc_spans(const Tensor& doc_start) {
    std::vector<DocSpan> spans;
    const int64_t b = doc_start.size(0), t = doc_start.size(1);
    const int32_t* d = doc_start.data<int32_t>();
    for (int64_t row = 0; row < b; ++row)
        for (int64_t i = 0; i < t; ++i)
            if (d[row * t + i] == i)
                spans.push_back({row, i, i + 1});
            else
                spans.back().end = i + 1;
    return spans;
}

// The span's rows of x [B, T, ...] in place ([len, ...], a view), and as a batch of one ([1, len, ...], a copy).
inline Tensor doc_view(const Tensor& x, const DocSpan& s) {
    return x.select(0, s.row).slice(0, s.first, s.end);
}
inline Tensor doc_rows(const Tensor& x, const DocSpan& s) {
    core::Shape shape = x.shape();
    shape[0] = 1;
    shape[1] = s.end - s.first;
    return doc_view(x, s).clone().reshape(shape);
}

}  // namespace mt::ops::cpu
