// Document masking of KDA (KdaOptions::doc_start, long_context.md §2): in a row that packs several documents the
// state restarts from zero at each document's first token, so each document's outputs and gradients equal that
// document run alone (f64, rho <= 1e-12), for the recurrent and the chunked algorithm, with documents that end
// mid-chunk and a one-token document; s0 feeds the row's first document only and st / dst belong to its last.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kda_inputs.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

// Row 0: documents [0, 13), [13, 14), [14, 37), [37, 40); row 1: one document of 40 tokens.
const std::vector<std::vector<int64_t>> kStarts = {{0, 13, 14, 37}, {0}};
constexpr int64_t kB = 2, kT = 40;

Tensor doc_start_map() {
    return testing::doc_start_map(kStarts, kT);
}

struct Pass {
    Tensor out, st, dq, dk, dv, dg, dbeta, ds0;
};

Pass run(const KdaInputs& in, const Tensor& dout, const Tensor& dst, const KdaOptions& options) {
    Pass r{op_like(in.v),
           Tensor(),
           op_like(in.q),
           op_like(in.k),
           op_like(in.v),
           op_like(in.g),
           op_like(in.beta),
           Tensor()};
    if (dst.defined()) r.st = op_like(dst);
    if (in.s0.defined()) r.ds0 = op_like(in.s0);
    kda_fwd(in.q, in.k, in.v, in.g, in.beta, in.s0, r.out, r.st, options);
    kda_bwd(in.q, in.k, in.v, in.g, in.beta, in.s0, dout, dst, r.dq, r.dk, r.dv, r.dg, r.dbeta, r.ds0, options);
    return r;
}

Tensor state(const Tensor& s, int64_t b) {
    core::Shape shape = s.shape();
    shape[0] = 1;
    return s.select(0, b).clone().reshape(shape);
}

TEST(KdaDocumentMask, PackedDocumentsEqualEachDocumentAlone) {
    const KdaShape shape{.b = kB, .t = kT, .h = 2, .hv = 4, .k = 4, .v = 4};
    const KdaInputs in = kda_make_inputs(shape, KdaGateRegime::bounded, true, 21);
    const Tensor dout = op_randn(in.v.shape(), 21, 10), dst = op_randn(in.s0.shape(), 21, 11);
    for (KdaAlgorithm algorithm : {KdaAlgorithm::recurrent, KdaAlgorithm::chunked}) {
        SCOPED_TRACE(algorithm == KdaAlgorithm::recurrent ? "recurrent" : "chunked");
        KdaOptions options{.algorithm = algorithm, .chunk_size = 32};
        const KdaOptions plain = options;
        options.doc_start = doc_start_map();
        const Pass packed = run(in, dout, dst, options);
        int documents = 0;
        for (int64_t b = 0; b < kB; ++b) {
            const auto& starts = kStarts[static_cast<size_t>(b)];
            for (size_t i = 0; i < starts.size(); ++i) {
                const int64_t first = starts[i], end = i + 1 < starts.size() ? starts[i + 1] : kT;
                SCOPED_TRACE(::testing::Message() << "row " << b << " document [" << first << ", " << end << ")");
                const KdaInputs doc{testing::doc_rows(in.q, b, first, end),
                                    testing::doc_rows(in.k, b, first, end),
                                    testing::doc_rows(in.v, b, first, end),
                                    testing::doc_rows(in.g, b, first, end),
                                    testing::doc_rows(in.beta, b, first, end),
                                    first == 0 ? state(in.s0, b) : Tensor()};
                const Pass alone =
                    run(doc, testing::doc_rows(dout, b, first, end), end == kT ? state(dst, b) : Tensor(), plain);
                const std::pair<const Tensor*, const Tensor*> pairs[] = {{&packed.out, &alone.out},
                                                                         {&packed.dq, &alone.dq},
                                                                         {&packed.dk, &alone.dk},
                                                                         {&packed.dv, &alone.dv},
                                                                         {&packed.dg, &alone.dg},
                                                                         {&packed.dbeta, &alone.dbeta}};
                for (const auto& [p, a] : pairs)
                    EXPECT_LE(testing::rho(testing::doc_rows(*p, b, first, end), *a), 1e-12);
                if (end == kT) {
                    EXPECT_LE(testing::rho(state(packed.st, b), alone.st), 1e-12);
                }
                if (first == 0) {
                    EXPECT_LE(testing::rho(state(packed.ds0, b), alone.ds0), 1e-12);
                }
                ++documents;
            }
        }
        EXPECT_EQ(documents, 5);
    }
}

TEST(KdaDocumentMask, RefusesAMalformedMap) {
    const KdaShape shape{.b = kB, .t = kT, .h = 2, .hv = 4, .k = 4, .v = 4};
    const KdaInputs in = kda_make_inputs(shape, KdaGateRegime::bounded, false, 3);
    Tensor out = op_like(in.v);
    KdaOptions options;
    options.doc_start = doc_start_map();
    core::tensor_set_flat(options.doc_start, 20, 2.0);  // neither 20 nor its predecessor's 14
    EXPECT_THROW(kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options), core::Error);
    options.doc_start = Tensor::zeros({kB, kT - 1}, DType::i32);
    EXPECT_THROW(kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), options), core::Error);
}

}  // namespace
}  // namespace mt::ops::test
