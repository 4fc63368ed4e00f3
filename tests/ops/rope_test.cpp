// Cases and argument checks of rotary position embedding (ops/rope.h), including the in-place forms.
#include "ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "op_harness.h"
#include "support/documents.h"

namespace mt::ops::test {
namespace {

// Per-token positions of a packed batch: each token's distance from its document's start (every row's documents
// start at 0 and then every `doc` tokens, the last one shorter).
Tensor document_positions(int64_t b, int64_t t, int64_t doc) {
    std::vector<std::vector<int64_t>> starts(static_cast<size_t>(b));
    for (auto& row : starts)
        for (int64_t s = 0; s < t; s += doc) row.push_back(s);
    const Tensor ds = mt::testing::doc_start_map(starts, t);
    Tensor pos = Tensor::zeros({b, t}, DType::i32);
    for (int64_t k = 0; k < b * t; ++k) pos.data<int32_t>()[k] = static_cast<int32_t>(k % t) - ds.data<int32_t>()[k];
    return pos;
}

// in_place: the forward runs with y aliasing x, and the backward with dx aliasing dy. doc > 0: per-token positions
// restarting every doc tokens (document_positions).
OpCase rope_case(
    int64_t b, int64_t t, int64_t h, int64_t d, double theta, int64_t pos_offset, bool in_place, int64_t doc = 0) {
    const std::string name = fmt::format("rope_b{}_t{}_h{}_d{}_pos{}{}{}",
                                         b,
                                         t,
                                         h,
                                         d,
                                         pos_offset,
                                         in_place ? "_inplace" : "",
                                         doc ? fmt::format("_doc{}", doc) : "");
    const Tensor host_positions = doc > 0 ? document_positions(b, t, doc) : Tensor();
    return {"rope", name, [=] {
                OpProblem p;
                p.inputs = {{"x", op_randn({b, t, h, d}, op_seed(name), 0), GradKind::written}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    const Tensor positions = doc > 0 ? host_positions.to_device(in[0].device()) : Tensor();
                    Tensor y = op_like(in[0]);
                    if (in_place) {
                        y.copy_from(in[0]);
                        rope_fwd(y, theta, pos_offset, y, positions);
                    } else {
                        rope_fwd(in[0], theta, pos_offset, y, positions);
                    }
                    return std::vector<Tensor>{y};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    const Tensor positions = doc > 0 ? host_positions.to_device(in[0].device()) : Tensor();
                    if (in_place) {
                        grads[0].copy_from(dout[0]);
                        rope_bwd(grads[0], theta, pos_offset, grads[0], positions);
                    } else {
                        rope_bwd(dout[0], theta, pos_offset, grads[0], positions);
                    }
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(rope_case(1, 1, 1, 2, 10000.0, 0, false));
    op_register(rope_case(2, 5, 3, 6, 10000.0, 0, false));
    op_register(rope_case(1, 7, 2, 16, 500000.0, 3, false));
    op_register(rope_case(2, 5, 3, 6, 10000.0, 0, true));
    op_register(rope_case(3, 37, 2, 10, 10000.0, 11, true));
    op_register(rope_case(4, 67, 4, 32, 10000.0, 0, false));  // large enough to run on the OpenMP team
    // CUDA sizes: the 8-wide vector path with long positions (angles computed in f64, as the CPU does).
    op_register(op_parity_only(rope_case(2, 1024, 4, 128, 10000.0, 0, false)));
    op_register(op_parity_only(rope_case(1, 300, 3, 64, 500000.0, 4000, true)));
    // Positions restarting at every document (document masking).
    op_register(rope_case(2, 9, 2, 6, 10000.0, 0, false, 4));
    op_register(rope_case(1, 11, 3, 8, 10000.0, 2, true, 3));
    op_register(op_parity_only(rope_case(2, 1000, 4, 128, 10000.0, 0, false, 300)));
    return true;
}();

// A packed row with per-document positions rotates each document as if it ran alone from position 0.
TEST(OpRope, DocumentPositionsEqualEachDocumentAlone) {
    const int64_t t = 10, h = 2, d = 6, doc = 4;
    const Tensor x = op_randn({2, t, h, d}, 17, 0), y = op_like(x);
    rope_fwd(x, 10000.0, 0, y, document_positions(2, t, doc));
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t first = 0; first < t; first += doc) {
            const int64_t end = std::min(first + doc, t);
            const Tensor alone = mt::testing::doc_rows(x, b, first, end), y_alone = op_like(alone);
            rope_fwd(alone, 10000.0, 0, y_alone);
            const Tensor packed = mt::testing::doc_rows(y, b, first, end);
            for (int64_t k = 0; k < packed.numel(); ++k)
                EXPECT_EQ(core::tensor_get_flat(packed, k), core::tensor_get_flat(y_alone, k)) << b << " " << first;
        }
}

TEST(OpRope, RejectsBadPositions) {
    const Tensor x = op_randn({1, 4, 1, 4}, 3, 0), y = op_like(x);
    Tensor pos = Tensor::zeros({1, 4}, DType::i32);
    pos.data<int32_t>()[2] = 4;
    expect_op_error([&] { rope_fwd(x, 10000.0, 0, y, pos); }, "rope_fwd: positions[2] = 4 is outside [0, 4)");
    expect_op_error(
        [&] {
            rope_fwd(x, 10000.0, 0, y, Tensor::zeros({1, 3}, DType::i32));
        },
        "rope_fwd: positions has shape [1, 3], expected [1, 4]");
    expect_op_error(
        [&] {
            rope_bwd(x, 10000.0, 0, y, Tensor::zeros({1, 4}, DType::f32));
        },
        "rope_bwd: positions has dtype f32, expected i32");
}

// The rotation itself, against the formula in the header at one (t, i).
TEST(OpRope, MatchesFormula) {
    const int64_t t = 5, d = 8, pos = 2;
    const double theta = 10000.0;
    const Tensor x = op_randn({1, t, 1, d}, 7, 0), y = op_like(x);
    rope_fwd(x, theta, pos, y);
    for (int64_t tt = 0; tt < t; ++tt) {
        for (int64_t i = 0; i < d / 2; ++i) {
            const double angle = static_cast<double>(pos + tt) * std::pow(theta, -2.0 * i / d);
            const double lo = x.at({0, tt, 0, i}), hi = x.at({0, tt, 0, i + d / 2});
            EXPECT_NEAR(y.at({0, tt, 0, i}), lo * std::cos(angle) - hi * std::sin(angle), 1e-14);
            EXPECT_NEAR(y.at({0, tt, 0, i + d / 2}), hi * std::cos(angle) + lo * std::sin(angle), 1e-14);
        }
    }
}

TEST(OpArgs, RopeShapesAndDtypes) {
    const Tensor x = Tensor::zeros({1, 2, 3, 4}, DType::f32), y = op_like(x);
    rope_fwd(x, 10000.0, 0, y);
    expect_op_error(
        [&] {
            rope_fwd(x, 10000.0, 0, Tensor::zeros({1, 2, 3, 6}, DType::f32));
        },
        "rope_fwd: y has shape [1, 2, 3, 6], expected [1, 2, 3, 4]");
    expect_op_error(
        [&] {
            rope_fwd(Tensor::zeros({1, 2, 3, 5}, DType::f32), 10000.0, 0, Tensor::zeros({1, 2, 3, 5}, DType::f32));
        },
        "rope_fwd: x has shape [1, 2, 3, 5]; the head dim D must be even");
    expect_op_error(
        [&] {
            rope_fwd(Tensor::zeros({2, 3, 4}, DType::f32), 10000.0, 0, y);
        },
        "rope_fwd: x has shape [2, 3, 4] (rank 3), expected rank 4");
    expect_op_error([&] { rope_fwd(x.to(DType::f16), 10000.0, 0, y); }, "rope_fwd: x has dtype f16");
    expect_op_error([&] { rope_fwd(x, 10000.0, 0, y.to(DType::f64)); },
                    "rope_fwd: y has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            rope_fwd(op_noncontiguous({1, 2, 3, 4}, DType::f32), 10000.0, 0, y);
        },
        "rope_fwd: x must be contiguous");
    expect_op_error([&] { rope_fwd(x, 0.0, 0, y); }, "rope_fwd: theta = 0 must be > 0");
    expect_op_error([&] { rope_fwd(x, 10000.0, -1, y); }, "rope_fwd: pos_offset = -1 must be >= 0");
    expect_op_error(
        [&] {
            rope_bwd(y, 10000.0, 0, Tensor::zeros({1, 2, 3, 2}, DType::f32));
        },
        "rope_bwd: dx has shape [1, 2, 3, 2], expected [1, 2, 3, 4]");
    expect_op_error(
        [&] {
            rope_bwd(y, 10000.0, 0, op_noncontiguous({1, 2, 3, 4}, DType::f32));
        },
        "rope_bwd: dx must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
