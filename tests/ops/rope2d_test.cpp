// Cases and argument checks of the 2-D rotary position embedding (ops/rope2d.h), including the in-place forms, and
// its definition: each half of a head is 1-D RoPE (ops/rope.h) of head dim D/2 at the row or column positions.
#include "ops/rope2d.h"

#include <gtest/gtest.h>

#include <cmath>

#include "image_grids.h"
#include "op_harness.h"
#include "ops/rope.h"

namespace mt::ops::test {
namespace {

// Packed images with these patch grids, H heads of dim d. in_place: the forward runs with y aliasing x, and the
// backward with dx aliasing dy.
OpCase rope2d_case(const ImageGrids& grids, int64_t h, int64_t d, double theta, bool in_place) {
    std::string dims;
    for (const auto& [gh, gw] : grids) dims += fmt::format("_{}x{}", gh, gw);
    const std::string name = fmt::format(
        "rope2d{}_h{}_d{}{}{}", dims, h, d, theta == kRope2dTheta ? "" : "_theta", in_place ? "_inplace" : "");
    const auto [rows_host, cols_host] = grid_positions(grids);
    const int64_t t = grids_patches(grids);
    return {"rope2d", name, [=] {
                OpProblem p;
                p.inputs = {{"x", op_randn({t, h, d}, op_seed(name), 0), GradKind::written}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    const Tensor rows = rows_host.to_device(in[0].device()), cols = cols_host.to_device(in[0].device());
                    Tensor y = op_like(in[0]);
                    if (in_place) {
                        y.copy_from(in[0]);
                        rope2d_fwd(y, rows, cols, y, theta);
                    } else {
                        rope2d_fwd(in[0], rows, cols, y, theta);
                    }
                    return std::vector<Tensor>{y};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    const Tensor rows = rows_host.to_device(in[0].device()), cols = cols_host.to_device(in[0].device());
                    if (in_place) {
                        grads[0].copy_from(dout[0]);
                        rope2d_bwd(grads[0], rows, cols, grads[0], theta);
                    } else {
                        rope2d_bwd(dout[0], rows, cols, grads[0], theta);
                    }
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(rope2d_case({{1, 1}}, 1, 4, kRope2dTheta, false));
    op_register(rope2d_case({{2, 3}}, 3, 8, kRope2dTheta, false));
    op_register(rope2d_case({{3, 4}, {2, 2}}, 2, 12, kRope2dTheta, false));  // D/4 = 3 pairs per half
    op_register(rope2d_case({{5, 3}, {1, 7}}, 3, 20, 100.0, true));
    op_register(rope2d_case({{16, 20}, {6, 4}}, 4, 32, kRope2dTheta, false));  // large enough for the OpenMP team
    // CUDA sizes: the SigLIP head (d_v = 1152 over 16 heads: D = 72) on packed 16x16 .. 40x24 grids, and D = 128.
    op_register(op_parity_only(rope2d_case({{16, 16}, {40, 24}, {2, 38}}, 16, 72, kRope2dTheta, false)));
    op_register(op_parity_only(rope2d_case({{32, 24}, {24, 32}}, 4, 128, kRope2dTheta, true)));
    return true;
}();

// The header's definition: half 0 of every head equals 1-D RoPE (ops/rope.h, head dim D/2) at positions rows, and
// half 1 at positions cols, bit for bit (the same f64 angles); and the backward inverts the forward.
TEST(OpRope2d, EachHalfIsRopeAtTheRowOrColumn) {
    const ImageGrids grids = {{4, 6}, {2, 10}};
    const int64_t t = grids_patches(grids), h = 3, d = 16, half = d / 2;
    const auto [rows, cols] = grid_positions(grids);
    const Tensor x = op_randn({t, h, d}, 23, 0), y = op_like(x);
    rope2d_fwd(x, rows, cols, y);
    int64_t limit = 0;
    for (const auto& [gh, gw] : grids) limit = std::max<int64_t>(limit, std::max(gh, gw));
    for (int64_t part = 0; part < 2; ++part) {
        const Tensor xh = x.slice(2, part * half, (part + 1) * half).clone().reshape({1, t, h, half});
        const Tensor pos = (part == 0 ? rows : cols).reshape({1, t}), yh = op_like(xh);
        rope_fwd(xh, kRope2dTheta, 0, yh, pos, limit);
        for (int64_t tt = 0; tt < t; ++tt)
            for (int64_t hh = 0; hh < h; ++hh)
                for (int64_t i = 0; i < half; ++i)
                    ASSERT_EQ(y.at({tt, hh, part * half + i}), yh.at({0, tt, hh, i})) << part << " " << tt << " " << i;
    }
    const Tensor back = op_like(x);
    rope2d_bwd(y, rows, cols, back);
    for (int64_t k = 0; k < x.numel(); ++k)
        EXPECT_NEAR(core::tensor_get_flat(back, k), core::tensor_get_flat(x, k), 1e-14);
}

// One pair against the formula in the header.
TEST(OpRope2d, MatchesFormula) {
    const int64_t d = 12, q = d / 4;
    Tensor rows = Tensor::zeros({1}, DType::i32), cols = Tensor::zeros({1}, DType::i32);
    rows.data<int32_t>()[0] = 5;
    cols.data<int32_t>()[0] = 9;
    const Tensor x = op_randn({1, 1, d}, 3, 0), y = op_like(x);
    rope2d_fwd(x, rows, cols, y, 500.0);
    for (int64_t part = 0; part < 2; ++part) {
        const int64_t o = part * d / 2, p = part == 0 ? 5 : 9;
        for (int64_t i = 0; i < q; ++i) {
            const double angle = static_cast<double>(p) * std::pow(500.0, -4.0 * static_cast<double>(i) / d);
            const double lo = x.at({0, 0, o + i}), hi = x.at({0, 0, o + i + q});
            EXPECT_NEAR(y.at({0, 0, o + i}), lo * std::cos(angle) - hi * std::sin(angle), 1e-14);
            EXPECT_NEAR(y.at({0, 0, o + i + q}), hi * std::cos(angle) + lo * std::sin(angle), 1e-14);
        }
    }
}

TEST(OpArgs, Rope2dShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 2, 8}, DType::f32), y = op_like(x);
    const Tensor rows = Tensor::zeros({3}, DType::i32), cols = Tensor::zeros({3}, DType::i32);
    rope2d_fwd(x, rows, cols, y);
    rope2d_bwd(y, rows, cols, op_like(x));
    expect_op_error(
        [&] {
            rope2d_fwd(x, rows, cols, Tensor::zeros({3, 2, 4}, DType::f32));
        },
        "rope2d_fwd: y has shape [3, 2, 4], expected [3, 2, 8]");
    expect_op_error(
        [&] {
            rope2d_fwd(Tensor::zeros({3, 2, 6}, DType::f32), rows, cols, Tensor::zeros({3, 2, 6}, DType::f32));
        },
        "rope2d_fwd: x has shape [3, 2, 6]; the head dim D must be divisible by 4");
    expect_op_error(
        [&] {
            rope2d_fwd(Tensor::zeros({3, 16}, DType::f32), rows, cols, y);
        },
        "rope2d_fwd: x has shape [3, 16] (rank 2), expected rank 3");
    expect_op_error([&] { rope2d_fwd(x.to(DType::f16), rows, cols, y); }, "rope2d_fwd: x has dtype f16");
    expect_op_error([&] { rope2d_fwd(x, rows, cols, y.to(DType::f64)); },
                    "rope2d_fwd: y has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            rope2d_fwd(op_noncontiguous({3, 2, 8}, DType::f32), rows, cols, y);
        },
        "rope2d_fwd: x must be contiguous");
    expect_op_error([&] { rope2d_fwd(x, rows, cols, y, 0.0); }, "rope2d_fwd: theta = 0 must be > 0");
    expect_op_error([&] { rope2d_fwd(x, Tensor::zeros({4}, DType::i32), cols, y); },
                    "rope2d_fwd: rows has shape [4], expected [3]");
    expect_op_error([&] { rope2d_fwd(x, rows, Tensor::zeros({3}, DType::f32), y); },
                    "rope2d_fwd: cols has dtype f32, expected i32");
    expect_op_error([&] { rope2d_fwd(x, rows, op_cuda_view({3}, DType::i32), y); },
                    "rope2d_fwd: cols must be on the device of x");
    Tensor negative = Tensor::zeros({3}, DType::i32);
    negative.data<int32_t>()[1] = -2;
    expect_op_error([&] { rope2d_fwd(x, negative, cols, y); }, "rope2d_fwd: rows[1] = -2 is outside [0, 2147483648)");
    expect_op_error(
        [&] {
            rope2d_bwd(y, rows, cols, Tensor::zeros({3, 2, 4}, DType::f32));
        },
        "rope2d_bwd: dx has shape [3, 2, 4], expected [3, 2, 8]");
    expect_op_error(
        [&] {
            rope2d_bwd(y, rows, cols, op_noncontiguous({3, 2, 8}, DType::f32));
        },
        "rope2d_bwd: dx must be contiguous");
}

}  // namespace
}  // namespace mt::ops::test
