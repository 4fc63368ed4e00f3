// Sequence segments at the op boundary (long_context.md §4): what the model's segment loop will carry from one
// segment to the next is enough for exact results. KDA: the first segment's final state is the second's initial
// state, and in the backward the second's ds0 is the first's dst. The short conv: the second segment convolves its
// rows after the first's last W - 1 input rows (its halo), drops those outputs, and the halo rows' input gradient adds
// into the first segment's. Uneven splits, mid-chunk ones included; outputs and every gradient equal one pass (f64,
// rho <= 1e-12). (Attention's part, a key prefix, is AttentionKeyPrefix.TwoSegmentsEqualOnePass.)
#include <gtest/gtest.h>

#include <vector>

#include "kda_inputs.h"
#include "ops/causal_conv1d.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

// Rows [first, end) of x [B, T, ...] as a contiguous copy.
Tensor rows(const Tensor& x, int64_t first, int64_t end) {
    return x.slice(1, first, end).clone();
}

// x [B, T, ...] with rows [first, first + part.size(1)) taking part's values (+= when add).
void put_rows(const Tensor& x, const Tensor& part, int64_t first, bool add) {
    const int64_t b = x.size(0), t = x.size(1), tp = part.size(1), row = x.numel() / (b * t);
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t i = 0; i < tp * row; ++i) {
            const int64_t at = (bb * t + first) * row + i;
            const double v = core::tensor_get_flat(part, bb * tp * row + i);
            core::tensor_set_flat(x, at, add ? core::tensor_get_flat(x, at) + v : v);
        }
}

struct KdaPass {
    Tensor out, st, dq, dk, dv, dg, dbeta, ds0;
};

KdaPass kda_run(const KdaInputs& in, const Tensor& s0, const Tensor& dout, const Tensor& dst, const KdaOptions& o) {
    KdaPass r{op_like(in.v),
              op_like(dst),
              op_like(in.q),
              op_like(in.k),
              op_like(in.v),
              op_like(in.g),
              op_like(in.beta),
              op_like(s0)};
    kda_fwd(in.q, in.k, in.v, in.g, in.beta, s0, r.out, r.st, o);
    kda_bwd(in.q, in.k, in.v, in.g, in.beta, s0, dout, dst, r.dq, r.dk, r.dv, r.dg, r.dbeta, r.ds0, o);
    return r;
}

KdaInputs kda_rows(const KdaInputs& in, int64_t first, int64_t end) {
    KdaInputs part = in;
    part.q = rows(in.q, first, end);
    part.k = rows(in.k, first, end);
    part.v = rows(in.v, first, end);
    part.g = rows(in.g, first, end);
    part.beta = rows(in.beta, first, end);
    return part;
}

TEST(SegmentOps, KdaStateCarriedForwardAndItsGradientBackEqualOnePass) {
    const KdaShape shape{.b = 2, .t = 90, .h = 2, .hv = 4, .k = 4, .v = 3};
    const KdaInputs in = kda_make_inputs(shape, KdaGateRegime::bounded, true, 51);
    const Tensor dout = op_randn(in.v.shape(), 51, 10), dst = op_randn(in.s0.shape(), 51, 11);
    const KdaOptions options{.algorithm = KdaAlgorithm::chunked, .chunk_size = 32};
    const KdaPass full = kda_run(in, in.s0, dout, dst, options);
    for (int64_t s : {int64_t{1}, int64_t{32}, int64_t{45}, int64_t{89}}) {
        SCOPED_TRACE(::testing::Message() << "split at " << s);
        const KdaInputs a = kda_rows(in, 0, s), b = kda_rows(in, s, shape.t);
        // Forward in order: the first segment's final state starts the second.
        Tensor st_a = op_like(in.s0), out_a = op_like(a.v), out_b = op_like(b.v), st_b = op_like(in.s0);
        kda_fwd(a.q, a.k, a.v, a.g, a.beta, in.s0, out_a, st_a, options);
        kda_fwd(b.q, b.k, b.v, b.g, b.beta, st_a, out_b, st_b, options);
        // Backward in reverse: the second segment's ds0 is the first's dst.
        const KdaPass gb = kda_run(b, st_a, rows(dout, s, shape.t), dst, options);
        const KdaPass ga = kda_run(a, in.s0, rows(dout, 0, s), gb.ds0, options);
        EXPECT_LE(mt::testing::rho(out_a, rows(full.out, 0, s)), 1e-12);
        EXPECT_LE(mt::testing::rho(out_b, rows(full.out, s, shape.t)), 1e-12);
        EXPECT_LE(mt::testing::rho(st_b, full.st), 1e-12);
        EXPECT_LE(mt::testing::rho(ga.ds0, full.ds0), 1e-12);
        const std::pair<const Tensor*, const Tensor*> grads[] = {
            {&ga.dq, &gb.dq}, {&ga.dk, &gb.dk}, {&ga.dv, &gb.dv}, {&ga.dg, &gb.dg}, {&ga.dbeta, &gb.dbeta}};
        const Tensor* whole[] = {&full.dq, &full.dk, &full.dv, &full.dg, &full.dbeta};
        for (size_t i = 0; i < 5; ++i) {
            EXPECT_LE(mt::testing::rho(*grads[i].first, rows(*whole[i], 0, s)), 1e-12) << "gradient " << i;
            EXPECT_LE(mt::testing::rho(*grads[i].second, rows(*whole[i], s, shape.t)), 1e-12) << "gradient " << i;
        }
    }
}

TEST(SegmentOps, ConvHaloCarriedForwardAndItsGradientBackEqualOnePass) {
    const int64_t b = 2, t = 37, c = 5, w = 4;
    const Tensor x = op_randn({b, t, c}, 61, 0), wt = op_randn({c, w}, 61, 1, 0.0, 0.5),
                 dy = op_randn({b, t, c}, 61, 2);
    for (bool silu : {false, true}) {
        const Tensor y = op_like(x), dx = op_like(x), dw = Tensor::zeros(wt.shape(), DType::f64);
        causal_conv1d_fwd(x, wt, y, silu);
        causal_conv1d_bwd(x, wt, dy, dx, dw, silu);
        for (int64_t s : {int64_t{2}, int64_t{3}, int64_t{20}}) {  // the first segment shorter than the halo, too
            SCOPED_TRACE(::testing::Message() << "silu " << silu << " split at " << s);
            const int64_t halo = std::min(w - 1, s);  // the rows before the second segment that it reads
            const Tensor xa = rows(x, 0, s), xb = rows(x, s - halo, t);  // the second with its halo in front
            const Tensor ya = op_like(xa), yb = op_like(xb);
            causal_conv1d_fwd(xa, wt, ya, silu);
            causal_conv1d_fwd(xb, wt, yb, silu);
            // The second segment's outputs on the halo rows are dropped (zero gradient there).
            Tensor dyb = op_like(xb);
            dyb.fill(0.0);
            put_rows(dyb, rows(dy, s, t), halo, false);
            const Tensor dxa = op_like(xa), dxb = op_like(xb), dw_seg = Tensor::zeros(wt.shape(), DType::f64);
            causal_conv1d_bwd(xb, wt, dyb, dxb, dw_seg, silu);
            causal_conv1d_bwd(xa, wt, rows(dy, 0, s), dxa, dw_seg, silu);
            put_rows(dxa, rows(dxb, 0, halo), s - halo, true);  // the halo's gradient goes back to its owner
            EXPECT_LE(mt::testing::rho(ya, rows(y, 0, s)), 1e-12);
            EXPECT_LE(mt::testing::rho(rows(yb, halo, t - s + halo), rows(y, s, t)), 1e-12);
            EXPECT_LE(mt::testing::rho(dxa, rows(dx, 0, s)), 1e-12);
            EXPECT_LE(mt::testing::rho(rows(dxb, halo, t - s + halo), rows(dx, s, t)), 1e-12);
            EXPECT_LE(mt::testing::rho(dw_seg, dw), 1e-12);
        }
    }
}

}  // namespace
}  // namespace mt::ops::test
