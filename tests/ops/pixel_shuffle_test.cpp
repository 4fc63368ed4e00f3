// Cases and argument checks of the 2x2 pixel shuffle (ops/pixel_shuffle.h): the permutation against the header's
// index formula, and the backward as its exact inverse.
#include "ops/pixel_shuffle.h"

#include <gtest/gtest.h>

#include <cstring>

#include "image_grids.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase pixel_shuffle_case(const ImageGrids& grids, int64_t c) {
    std::string dims;
    for (const auto& [h, w] : grids) dims += fmt::format("_{}x{}", h, w);
    const std::string name = fmt::format("pixel_shuffle{}_c{}", dims, c);
    const Tensor grids_host = grids_tensor(grids);
    const int64_t p = grids_patches(grids);
    OpCase oc{"pixel_shuffle", name, [=] {
                  OpProblem pr;
                  pr.inputs = {{"x", op_randn({p, c}, op_seed(name), 0), GradKind::written}};
                  pr.forward = [=](const std::vector<Tensor>& in) {
                      Tensor y = op_like(in[0], {p / 4, 4 * c});
                      pixel_shuffle_fwd(in[0], grids_host, y);
                      return std::vector<Tensor>{y};
                  };
                  pr.backward = [=](const std::vector<Tensor>&,
                                    const std::vector<Tensor>& dout,
                                    const std::vector<Tensor>& grads) {
                      pixel_shuffle_bwd(grids_host, dout[0], grads[0]);
                  };
                  return pr;
              }};
    // A permutation: the CUDA side must equal the CPU reference bit for bit in every dtype.
    oc.parity.bf16_budget = 0.0;
    oc.parity.f32_budget = 0.0;
    oc.parity.budget_reason = "a permutation of the input rows: bitwise equal";
    return oc;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(pixel_shuffle_case({{2, 2}}, 1));
    op_register(pixel_shuffle_case({{2, 4}, {4, 2}}, 3));
    op_register(pixel_shuffle_case({{6, 4}, {2, 2}, {4, 6}}, 5));
    op_register(pixel_shuffle_case({{16, 20}, {10, 8}}, 96));  // large enough to run on the OpenMP team
    // CUDA sizes: d_v = 1152 (16-byte words) on the spec's 8x8 .. 24x24 grids, odd widths (2-byte words in bf16), and
    // many small images (the binary search over image starts).
    op_register(op_parity_only(pixel_shuffle_case({{24, 24}, {8, 8}, {16, 12}, {12, 20}}, 1152)));
    op_register(op_parity_only(pixel_shuffle_case({{24, 24}, {2, 38}}, 1151)));
    op_register(op_parity_only(pixel_shuffle_case(
        {{2, 2}, {4, 2}, {2, 6}, {6, 6}, {2, 2}, {8, 4}, {4, 4}, {2, 2}, {10, 2}, {2, 2}, {4, 8}, {2, 4}}, 66)));
    return true;
}();

// The forward against the header's formula, element by element, on packed images; and bwd(fwd(x)) = x bitwise.
TEST(OpPixelShuffle, MatchesFormulaAndInverts) {
    const ImageGrids grids = {{4, 6}, {2, 2}, {6, 2}};
    const int64_t p = grids_patches(grids), c = 3;
    const Tensor x = op_randn({p, c}, 41, 0).to(DType::f32), y = Tensor::zeros({p / 4, 4 * c}, DType::f32);
    pixel_shuffle_fwd(x, grids_tensor(grids), y);
    int64_t o_k = 0;
    for (const auto& [h, w] : grids) {
        for (int64_t r = 0; r < h / 2; ++r)
            for (int64_t cc = 0; cc < w / 2; ++cc)
                for (int64_t q = 0; q < 4; ++q)
                    for (int64_t j = 0; j < c; ++j)
                        ASSERT_EQ(y.at({o_k + r * (w / 2) + cc, q * c + j}),
                                  x.at({4 * o_k + (2 * r + q / 2) * w + 2 * cc + q % 2, j}));
        o_k += h * w / 4;
    }
    Tensor back = op_like(x);
    back.fill(std::nan(""));
    pixel_shuffle_bwd(grids_tensor(grids), y, back);
    ASSERT_TRUE(op_same_bytes(back, x));
}

// One image's output rows are those of it alone: images are independent and in order.
TEST(OpPixelShuffle, PackedImagesAreIndependent) {
    const ImageGrids grids = {{4, 4}, {2, 6}};
    const int64_t c = 2;
    const Tensor x = op_randn({grids_patches(grids), c}, 43, 0), y = Tensor::zeros({7, 4 * c}, DType::f64);
    pixel_shuffle_fwd(x, grids_tensor(grids), y);
    int64_t first = 0, out = 0;
    for (const auto& g : grids) {
        const int64_t n = int64_t{g.first} * g.second;
        const Tensor alone = Tensor::zeros({n / 4, 4 * c}, DType::f64);
        pixel_shuffle_fwd(x.slice(0, first, first + n).clone(), grids_tensor({g}), alone);
        EXPECT_TRUE(op_same_bytes(y.slice(0, out, out + n / 4).clone(), alone));
        first += n;
        out += n / 4;
    }
}

TEST(OpArgs, PixelShuffleShapesAndDtypes) {
    const Tensor x = Tensor::zeros({12, 3}, DType::f32), y = Tensor::zeros({3, 12}, DType::f32);
    const Tensor g = grids_tensor({{2, 2}, {2, 4}});
    pixel_shuffle_fwd(x, g, y);
    pixel_shuffle_bwd(g, y, op_like(x));
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, grids_tensor({{2, 2}, {3, 2}}), y);
        },
        "pixel_shuffle_fwd: image 1 has a 3x2 patch grid; h and w must be even and > 0");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, grids_tensor({{2, 2}, {0, 4}}), y);
        },
        "pixel_shuffle_fwd: image 1 has a 0x4 patch grid");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, grids_tensor({{2, 2}, {2, 2}}), y);
        },
        "pixel_shuffle_fwd: the grids hold 8 patches but x has 12 rows");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, g, Tensor::zeros({3, 11}, DType::f32));
        },
        "pixel_shuffle_fwd: y has shape [3, 11], expected [3, 12]");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, Tensor::zeros({2, 3}, DType::i32), y);
        },
        "pixel_shuffle_fwd: grids has shape [2, 3], expected [n, 2]");
    expect_op_error([&] { pixel_shuffle_fwd(x, g.to(DType::f32), y); },
                    "pixel_shuffle_fwd: grids has dtype f32, expected i32");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, op_cuda_view({2, 2}, DType::i32), y);
        },
        "pixel_shuffle_fwd: grids must be a host tensor");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(x, g, op_cuda_view({3, 12}, DType::f32));
        },
        "pixel_shuffle_fwd: y is on cuda but x is on cpu");
    expect_op_error([&] { pixel_shuffle_fwd(x.to(DType::i32), g, y); }, "pixel_shuffle_fwd: x has dtype i32");
    expect_op_error([&] { pixel_shuffle_fwd(x, g, y.to(DType::f64)); },
                    "pixel_shuffle_fwd: y has dtype f64, expected f32 (the dtype of x)");
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(op_noncontiguous({12, 3}, DType::f32), g, y);
        },
        "pixel_shuffle_fwd: x must be contiguous");
    const Tensor square = Tensor::zeros({4, 4}, DType::f32);
    expect_op_error(
        [&] {
            pixel_shuffle_fwd(square, grids_tensor({{2, 2}}), square.reshape({1, 16}));
        },
        "pixel_shuffle_fwd: y must not alias x");
    expect_op_error(
        [&] {
            pixel_shuffle_bwd(g, y, Tensor::zeros({8, 3}, DType::f32));
        },
        "pixel_shuffle_bwd: the grids hold 12 patches but dx has 8 rows");
    expect_op_error(
        [&] {
            pixel_shuffle_bwd(g, Tensor::zeros({3, 10}, DType::f32), op_like(x));
        },
        "pixel_shuffle_bwd: dy has shape [3, 10], expected [3, 12]");
    expect_op_error([&] { pixel_shuffle_bwd(g, y.to(DType::f64), op_like(x)); },
                    "pixel_shuffle_bwd: dy has dtype f64, expected f32 (the dtype of dx)");
}

}  // namespace
}  // namespace mt::ops::test
