// Document masking of the causal short conv (doc_start, long_context.md §2): the halo resets at every document, so
// each document of a packed row gives the outputs and input gradients of that document run alone and the weight
// gradient is the sum over the documents (f64, rho <= 1e-12), with and without SiLU; a malformed map is refused.
#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"
#include "ops/causal_conv1d.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops {
namespace {

using core::DType;
using core::Tensor;

// Row 0: documents [0, 2) (shorter than the width), [2, 3) (one token), [3, 11), [11, 17); row 1: one document.
const std::vector<std::vector<int64_t>> kStarts = {{0, 2, 3, 11}, {0}};
constexpr int64_t kB = 2, kT = 17, kC = 5, kW = 4;

Tensor doc_start_map() {
    return testing::doc_start_map(kStarts, kT);
}

Tensor normal(const core::Shape& shape, uint64_t stream) {
    Tensor t = Tensor::zeros(shape, DType::f64);
    core::rng_fill_normal(t, 23, stream, 0.0, 1.0);
    return t;
}

TEST(CausalConv1dDocumentMask, PackedDocumentsEqualEachDocumentAlone) {
    const Tensor x = normal({kB, kT, kC}, 1), w = normal({kC, kW}, 2), dy = normal({kB, kT, kC}, 3);
    for (bool silu : {false, true}) {
        SCOPED_TRACE(silu ? "silu" : "identity");
        Tensor y = Tensor::zeros(x.shape(), DType::f64), dx = Tensor::zeros(x.shape(), DType::f64);
        Tensor dw = Tensor::zeros(w.shape(), DType::f64), dw_sum = Tensor::zeros(w.shape(), DType::f64);
        causal_conv1d_fwd(x, w, y, silu, doc_start_map());
        causal_conv1d_bwd(x, w, dy, dx, dw, silu, doc_start_map());
        int documents = 0;
        for (int64_t b = 0; b < kB; ++b) {
            const auto& starts = kStarts[static_cast<size_t>(b)];
            for (size_t i = 0; i < starts.size(); ++i) {
                const int64_t first = starts[i], end = i + 1 < starts.size() ? starts[i + 1] : kT;
                SCOPED_TRACE(::testing::Message() << "row " << b << " document [" << first << ", " << end << ")");
                const Tensor xs = testing::doc_rows(x, b, first, end);
                Tensor ys = Tensor::zeros(xs.shape(), DType::f64), dxs = Tensor::zeros(xs.shape(), DType::f64);
                causal_conv1d_fwd(xs, w, ys, silu);
                causal_conv1d_bwd(xs, w, testing::doc_rows(dy, b, first, end), dxs, dw_sum, silu);
                EXPECT_LE(testing::rho(testing::doc_rows(y, b, first, end), ys), 1e-12);
                EXPECT_LE(testing::rho(testing::doc_rows(dx, b, first, end), dxs), 1e-12);
                ++documents;
            }
        }
        EXPECT_EQ(documents, 5);
        EXPECT_LE(testing::rho(dw, dw_sum), 1e-12);
    }
}

TEST(CausalConv1dDocumentMask, RefusesAMalformedMap) {
    const Tensor x = normal({kB, kT, kC}, 1), w = normal({kC, kW}, 2);
    Tensor y = Tensor::zeros(x.shape(), DType::f64);
    Tensor bad = doc_start_map();
    core::tensor_set_flat(bad, 7, 1.0);  // neither 7 nor its predecessor's 3
    EXPECT_THROW(causal_conv1d_fwd(x, w, y, false, bad), core::Error);
    EXPECT_THROW(causal_conv1d_fwd(x, w, y, false, Tensor::zeros({kB + 1, kT}, DType::i32)), core::Error);
}

}  // namespace
}  // namespace mt::ops
