// Document masking of causal attention (AttentionMask::doc_start, long_context.md §2): a row that packs several
// documents gives, for each document, exactly the outputs, lse and gradients of that document run alone (f64,
// rho <= 1e-12), including one-token documents; the masked op's gradients agree with central finite differences;
// an all-zero map is the unmasked op bit for bit; a malformed map, or one on another device than the data, is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "ops/attention.h"
#include "support/documents.h"
#include "support/finite_differences.h"
#include "support/rho.h"

namespace mt::ops {
namespace {

using core::DType;
using core::Tensor;

constexpr int64_t kB = 2, kT = 23, kHq = 4, kHkv = 2, kD = 8;

// Row 0 packs documents [0, 7), [7, 8) (one token), [8, 16), [16, 23); row 1 is one document.
const std::vector<std::vector<int64_t>> kStarts = {{0, 7, 8, 16}, {0}};

Tensor doc_start_map() {
    return testing::doc_start_map(kStarts, kT);
}

Tensor normal(const core::Shape& shape, uint64_t stream) {
    Tensor t = Tensor::zeros(shape, DType::f64);
    core::rng_fill_normal(t, 17, stream, 0.0, 1.0);
    return t;
}

struct Pass {
    Tensor out, lse, dq, dk, dv;
};

Pass run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionMask& mask) {
    Pass r{Tensor::zeros(q.shape(), DType::f64),
           Tensor::zeros({q.size(0), q.size(2), q.size(1)}, DType::f64),
           Tensor::zeros(q.shape(), DType::f64),
           Tensor::zeros(k.shape(), DType::f64),
           Tensor::zeros(v.shape(), DType::f64)};
    attention_fwd(q, k, v, r.out, r.lse, {}, mask);
    attention_bwd(q, k, v, r.out, r.lse, dout, r.dq, r.dk, r.dv, {}, mask);
    return r;
}

TEST(AttentionDocumentMask, PackedDocumentsEqualEachDocumentAlone) {
    const Tensor q = normal({kB, kT, kHq, kD}, 1), k = normal({kB, kT, kHkv, kD}, 2), v = normal({kB, kT, kHkv, kD}, 3);
    const Tensor dout = normal({kB, kT, kHq, kD}, 4);
    const Pass packed = run(q, k, v, dout, {doc_start_map()});
    int documents = 0;
    for (int64_t b = 0; b < kB; ++b) {
        const auto& starts = kStarts[static_cast<size_t>(b)];
        for (size_t i = 0; i < starts.size(); ++i) {
            const int64_t first = starts[i], end = i + 1 < starts.size() ? starts[i + 1] : kT;
            SCOPED_TRACE(::testing::Message() << "row " << b << " document [" << first << ", " << end << ")");
            const Pass alone = run(testing::doc_rows(q, b, first, end),
                                   testing::doc_rows(k, b, first, end),
                                   testing::doc_rows(v, b, first, end),
                                   testing::doc_rows(dout, b, first, end),
                                   {});
            EXPECT_LE(testing::rho(testing::doc_rows(packed.out, b, first, end), alone.out), 1e-12);
            if (end - first == 1) {
                // One key: the softmax is constant, so dq and dk are exactly zero and both sides hold rounding noise
                // (whose pattern depends on the BLAS kernels of the machine): judge them on an absolute scale.
                for (const Tensor& x : {testing::doc_rows(packed.dq, b, first, end),
                                        testing::doc_rows(packed.dk, b, first, end),
                                        alone.dq,
                                        alone.dk})
                    for (int64_t i = 0; i < x.numel(); ++i) EXPECT_LE(std::abs(core::tensor_get_flat(x, i)), 1e-12);
            } else {
                EXPECT_LE(testing::rho(testing::doc_rows(packed.dq, b, first, end), alone.dq), 1e-12);
                EXPECT_LE(testing::rho(testing::doc_rows(packed.dk, b, first, end), alone.dk), 1e-12);
            }
            EXPECT_LE(testing::rho(testing::doc_rows(packed.dv, b, first, end), alone.dv), 1e-12);
            // lse [B, H, T]: the document's columns of every head
            for (int64_t h = 0; h < kHq; ++h)
                for (int64_t t = first; t < end; ++t)
                    EXPECT_NEAR(core::tensor_get_flat(packed.lse, (b * kHq + h) * kT + t),
                                core::tensor_get_flat(alone.lse, h * (end - first) + t - first),
                                1e-12);
            ++documents;
        }
    }
    EXPECT_EQ(documents, 5);
}

// loss = sum(dout * out): its gradients against central differences, step 1e-6, at a few entries of q, k and v
// (among them keys of one document that a query of the next would see without the mask).
TEST(AttentionDocumentMask, GradientsMatchFiniteDifferences) {
    Tensor q = normal({kB, kT, kHq, kD}, 5), k = normal({kB, kT, kHkv, kD}, 6), v = normal({kB, kT, kHkv, kD}, 7);
    const Tensor dout = normal({kB, kT, kHq, kD}, 8);
    const AttentionMask mask{doc_start_map()};
    const Pass r = run(q, k, v, dout, mask);
    auto loss = [&]() {
        Tensor out = Tensor::zeros(q.shape(), DType::f64), lse = Tensor::zeros({kB, kHq, kT}, DType::f64);
        attention_fwd(q, k, v, out, lse, {}, mask);
        double s = 0.0;
        for (int64_t i = 0; i < out.numel(); ++i) s += core::tensor_get_flat(out, i) * core::tensor_get_flat(dout, i);
        return s;
    };
    const int checked =
        testing::expect_central_differences(loss, {{&q, &r.dq}, {&k, &r.dk}, {&v, &r.dv}}, [](int64_t n) {
            return std::vector<int64_t>{3, n / 3, n / 2 + 5, n - 1};
        });
    EXPECT_EQ(checked, 12);
}

TEST(AttentionDocumentMask, OneDocumentPerRowIsTheUnmaskedOpBitForBit) {
    const Tensor q = normal({kB, kT, kHq, kD}, 9), k = normal({kB, kT, kHkv, kD}, 10),
                 v = normal({kB, kT, kHkv, kD}, 11);
    const Tensor dout = normal({kB, kT, kHq, kD}, 12);
    const Pass plain = run(q, k, v, dout, {}), zeros = run(q, k, v, dout, {Tensor::zeros({kB, kT}, DType::i32)});
    for (const auto& [a, b] : {std::pair{&plain.out, &zeros.out},
                               {&plain.lse, &zeros.lse},
                               {&plain.dq, &zeros.dq},
                               {&plain.dk, &zeros.dk},
                               {&plain.dv, &zeros.dv}})
        EXPECT_EQ(std::memcmp(a->raw(), b->raw(), a->nbytes()), 0);
}

TEST(AttentionDocumentMask, RefusesAMalformedMap) {
    const Tensor q = normal({kB, kT, kHq, kD}, 1), k = normal({kB, kT, kHkv, kD}, 2), v = normal({kB, kT, kHkv, kD}, 3);
    Tensor out = Tensor::zeros(q.shape(), DType::f64), lse = Tensor::zeros({kB, kHq, kT}, DType::f64);
    Tensor bad = doc_start_map();
    core::tensor_set_flat(bad, 5, 3.0);  // neither 5 nor its predecessor's 0
    EXPECT_THROW(attention_fwd(q, k, v, out, lse, {}, {bad}), core::Error);
    EXPECT_THROW(attention_fwd(q, k, v, out, lse, {}, {Tensor::zeros({kB, kT + 1}, DType::i32)}), core::Error);
    EXPECT_THROW(attention_fwd(q, k, v, out, lse, {}, {Tensor::zeros({kB, kT}, DType::f32)}), core::Error);
    // A map on another device than the data is refused (the CUDA kernels take a device map).
    if (core::backend_available(core::Device::cuda)) {
        const core::Device gpu = core::Device::cuda;
        const Tensor qg = q.to(DType::f32).to_device(gpu), kg = k.to(DType::f32).to_device(gpu),
                     vg = v.to(DType::f32).to_device(gpu);
        Tensor og = Tensor::zeros(q.shape(), DType::f32, gpu), lg = Tensor::zeros({kB, kHq, kT}, DType::f32, gpu);
        EXPECT_THROW(attention_fwd(qg, kg, vg, og, lg, {}, {doc_start_map()}), core::Error);
    }
}

}  // namespace
}  // namespace mt::ops
