// Bidirectional attention within documents (AttentionMask::causal = false, the vision encoder's packed images,
// multimodal.md §1 and §9 test 2): the op against the definition written as loops (every key of the query's own
// document, with and without a key prefix), packed images independent bit for bit (perturbing image B leaves image
// A's outputs and gradients unchanged), each packed image equal to that image alone, harness cases (fp64 finite
// differences on the CPU and CUDA parity, ViT head dims 16 and 72 among them), and the refusal of a window.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "op_harness.h"
#include "ops/attention.h"
#include "support/documents.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

Tensor lse_of(const Tensor& q) {
    const bool cuda = q.device() == core::Device::cuda;
    return Tensor::zeros({q.size(0), q.size(2), q.size(1)}, cuda ? DType::f32 : q.dtype(), q.device());
}

// Row 0 packs documents [0, 5), [5, 6) (one token), [6, 13), [13, t); row 1 is one document (t >= 16).
const std::vector<std::vector<int64_t>> kStarts = {{0, 5, 6, 13}, {0}};

struct Pass {
    Tensor out, lse, dq, dk, dv;
};

Pass run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const AttentionMask& mask) {
    Pass r{op_like(q), lse_of(q), op_like(q), op_like(k), op_like(v)};
    attention_fwd(q, k, v, r.out, r.lse, {}, mask);
    attention_bwd(q, k, v, r.out, r.lse, dout, r.dq, r.dk, r.dv, {}, mask);
    return r;
}

Tensor randn64(const core::Shape& shape, uint64_t stream) {
    return op_randn(shape, 31, stream).to(DType::f64);
}

// out and lse by the definition: query i (at key position off + i) sees the keys s of its document
// (doc_start[s] == doc_start[off + i]; every key without a map).
void expect_definition(int64_t t, int64_t tk, bool docs) {
    const int64_t b = 2, hq = 4, hkv = 2, d = 6, off = tk - t;
    const Tensor q = randn64({b, t, hq, d}, 1), k = randn64({b, tk, hkv, d}, 2), v = randn64({b, tk, hkv, d}, 3);
    const Tensor map = mt::testing::doc_start_map(kStarts, tk);
    Tensor out = op_like(q), lse = lse_of(q);
    attention_fwd(q, k, v, out, lse, {}, {.doc_start = docs ? map : Tensor(), .causal = false});
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    double worst = 0.0;
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < hq; ++h)
            for (int64_t i = 0; i < t; ++i) {
                const int64_t kh = h / (hq / hkv), pos = off + i;
                auto doc = [&](int64_t s) { return docs ? core::tensor_get_flat(map, bb * tk + s) : 0.0; };
                std::vector<double> s(static_cast<size_t>(tk), -INFINITY);
                double mx = -INFINITY;
                for (int64_t j = 0; j < tk; ++j) {
                    if (doc(j) != doc(pos)) continue;
                    double dot = 0.0;
                    for (int64_t c = 0; c < d; ++c)
                        dot += core::tensor_get_flat(q, ((bb * t + i) * hq + h) * d + c) *
                               core::tensor_get_flat(k, ((bb * tk + j) * hkv + kh) * d + c);
                    s[static_cast<size_t>(j)] = dot * scale;
                    mx = std::max(mx, dot * scale);
                }
                double sum = 0.0;
                for (double x : s) sum += std::exp(x - mx);
                worst =
                    std::max(worst, std::abs(core::tensor_get_flat(lse, (bb * hq + h) * t + i) - (mx + std::log(sum))));
                for (int64_t c = 0; c < d; ++c) {
                    double o = 0.0;
                    for (int64_t j = 0; j < tk; ++j)
                        o += std::exp(s[static_cast<size_t>(j)] - mx) / sum *
                             core::tensor_get_flat(v, ((bb * tk + j) * hkv + kh) * d + c);
                    worst = std::max(worst, std::abs(core::tensor_get_flat(out, ((bb * t + i) * hq + h) * d + c) - o));
                }
            }
    EXPECT_LE(worst, 1e-12);
}

TEST(AttentionBidirectional, MatchesTheDefinition) {
    expect_definition(19, 19, false);
    expect_definition(19, 19, true);
}

// A key prefix: documents that began before the queries are seen whole, and so is the rest of each query's document.
TEST(AttentionBidirectional, MatchesTheDefinitionWithAKeyPrefix) {
    expect_definition(9, 19, true);
    expect_definition(9, 19, false);
}

// Perturbing one packed document (image) changes nothing of another, bit for bit, and every document equals itself
// run alone (rho 1e-12, f64).
TEST(AttentionBidirectional, PackedDocumentsAreIndependent) {
    const int64_t t = 19, hq = 4, hkv = 2, d = 6;
    const Tensor q = randn64({2, t, hq, d}, 4), k = randn64({2, t, hkv, d}, 5), v = randn64({2, t, hkv, d}, 6);
    const Tensor dout = randn64({2, t, hq, d}, 7);
    const AttentionMask mask{.doc_start = mt::testing::doc_start_map(kStarts, t), .causal = false};
    const Pass base = run(q, k, v, dout, mask);
    // Perturb document [6, 13) of row 0 in q, k, v and dout.
    std::vector<Tensor> moved;
    for (const Tensor& x : {q, k, v, dout}) {
        Tensor y = x.clone();
        const Tensor doc = y.select(0, 0).slice(0, 6, 13);
        doc.copy_from(randn64(doc.shape(), 8));
        moved.push_back(y);
    }
    const Pass other = run(moved[0], moved[1], moved[2], moved[3], mask);
    for (int64_t first : {int64_t{0}, int64_t{13}}) {
        const int64_t end = first == 0 ? 6 : t;  // documents [0, 5), [5, 6) and [13, t) of row 0
        for (const auto& [a, b] :
             {std::pair{&base.out, &other.out}, {&base.dq, &other.dq}, {&base.dk, &other.dk}, {&base.dv, &other.dv}}) {
            const Tensor x = a->select(0, 0).slice(0, first, end).clone(),
                         y = b->select(0, 0).slice(0, first, end).clone();
            EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << "rows [" << first << ", " << end << ")";
        }
    }
    const std::vector<int64_t> starts = kStarts[0];
    for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t first = starts[i], end = i + 1 < starts.size() ? starts[i + 1] : t;
        auto rows = [&](const Tensor& x) { return mt::testing::doc_rows(x, 0, first, end); };
        const Pass alone = run(rows(q), rows(k), rows(v), rows(dout), {.causal = false});
        EXPECT_LE(mt::testing::rho(rows(base.out), alone.out), 1e-12) << first;
        EXPECT_LE(mt::testing::rho(rows(base.dv), alone.dv), 1e-12) << first;
        if (end - first > 1) {  // one key: dq and dk are rounding noise around zero
            EXPECT_LE(mt::testing::rho(rows(base.dq), alone.dq), 1e-12) << first;
            EXPECT_LE(mt::testing::rho(rows(base.dk), alone.dk), 1e-12) << first;
        }
    }
}

TEST(AttentionBidirectional, RefusesAWindow) {
    const Tensor q = randn64({1, 8, 2, 4}, 1), k = randn64({1, 8, 2, 4}, 2), v = randn64({1, 8, 2, 4}, 3);
    Tensor out = op_like(q), lse = lse_of(q);
    EXPECT_THROW(attention_fwd(q, k, v, out, lse, {}, {.window = 4, .causal = false}), core::Error);
}

// Harness cases: fp64 finite differences on the CPU, CUDA parity (the generic kernels) on the GPU.
OpCase bidirectional_case(int64_t t, int64_t tk, int64_t hq, int64_t hkv, int64_t d, bool docs) {
    const std::string name =
        fmt::format("attention_bidir_t{}_tk{}_hq{}_hkv{}_d{}{}", t, tk, hq, hkv, d, docs ? "_docs" : "");
    const Tensor host_docs = mt::testing::doc_start_map(kStarts, tk);
    return {"attention", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"q", op_randn({2, t, hq, d}, s, 0), GradKind::written},
                            {"k", op_randn({2, tk, hkv, d}, s, 1), GradKind::written},
                            {"v", op_randn({2, tk, hkv, d}, s, 2), GradKind::written}};
                auto mask_on = [=](core::Device device) {
                    return AttentionMask{.doc_start = docs ? host_docs.to_device(device) : Tensor(), .causal = false};
                };
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor out = op_like(in[0]), lse = lse_of(in[0]);
                    attention_fwd(in[0], in[1], in[2], out, lse, {}, mask_on(in[0].device()));
                    return std::vector<Tensor>{out};
                };
                p.backward =
                    [=](const std::vector<Tensor>& in, const std::vector<Tensor>& dout, const std::vector<Tensor>& g) {
                        Tensor out = op_like(in[0]), lse = lse_of(in[0]);
                        const AttentionMask mask = mask_on(in[0].device());
                        attention_fwd(in[0], in[1], in[2], out, lse, {}, mask);
                        attention_bwd(in[0], in[1], in[2], out, lse, dout[0], g[0], g[1], g[2], {}, mask);
                    };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(bidirectional_case(17, 17, 2, 1, 5, false));
    op_register(bidirectional_case(17, 17, 4, 2, 16, true));  // the tiny ViT's head dim
    op_register(bidirectional_case(7, 17, 2, 2, 8, true));    // a key prefix
    op_register(bidirectional_case(70, 70, 2, 2, 72, true));  // the reference ViT's head dim (1152 / 16)
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
