// Cases and argument checks of the bilinear resize of the position table (ops/bilinear_resize.h): up- and
// down-sampling on odd and prime sizes, 1-cell axes, packed images; the per-axis taps against hand-computed values; a
// grid equal to the table an exact copy; packed images each the same as alone. PyTorch's F.interpolate is the golden
// reference in vision_ops_golden_test.cpp.
#include "ops/bilinear_resize.h"

#include <gtest/gtest.h>

#include "image_grids.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase bilinear_resize_case(int64_t hm, int64_t wm, int64_t c, const ImageGrids& grids) {
    std::string dims;
    for (const auto& [h, w] : grids) dims += fmt::format("_{}x{}", h, w);
    const std::string name = fmt::format("bilinear_resize_t{}x{}_c{}{}", hm, wm, c, dims);
    const Tensor grids_host = grids_tensor(grids);
    const int64_t p = grids_patches(grids);
    OpCase oc{"bilinear_resize", name, [=] {
                  OpProblem pr;
                  pr.inputs = {{"table", op_randn({hm, wm, c}, op_seed(name), 0), GradKind::accumulated}};
                  pr.forward = [=](const std::vector<Tensor>& in) {
                      Tensor y = op_like(in[0], {p, c});
                      bilinear_resize_fwd(in[0], grids_host, y);
                      return std::vector<Tensor>{y};
                  };
                  pr.backward = [=](const std::vector<Tensor>&,
                                    const std::vector<Tensor>& dout,
                                    const std::vector<Tensor>& grads) {
                      bilinear_resize_bwd(grids_host, dout[0], grads[0]);
                  };
                  return pr;
              }};
    return oc;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(bilinear_resize_case(1, 1, 1, {{1, 1}}));           // the identity at its smallest
    op_register(bilinear_resize_case(1, 1, 3, {{3, 2}, {1, 5}}));   // one cell stretched: every output is that cell
    op_register(bilinear_resize_case(5, 3, 2, {{5, 3}}));           // h == Hm, w == Wm: a copy
    op_register(bilinear_resize_case(5, 3, 2, {{7, 2}, {2, 11}}));  // up one axis and down the other
    op_register(bilinear_resize_case(7, 7, 3, {{7, 7}, {3, 5}, {11, 13}, {1, 1}, {2, 14}}));
    op_register(bilinear_resize_case(13, 2, 5, {{1, 3}, {26, 1}, {4, 2}}));
    op_register(bilinear_resize_case(32, 32, 48, {{16, 16}, {24, 40}}));  // large enough to run on the OpenMP team
    // CUDA sizes: the reference table (32 x 32 of d_v = 1152) to the spec's 8x8 .. 32x32 grids and beyond it; an odd
    // width; many small images (the binary search over image starts, the backward's per-image loop).
    op_register(op_parity_only(bilinear_resize_case(32, 32, 1152, {{32, 32}, {8, 8}, {16, 12}, {40, 30}})));
    op_register(op_parity_only(bilinear_resize_case(32, 32, 1151, {{24, 24}, {2, 38}})));
    op_register(op_parity_only(bilinear_resize_case(
        16,
        16,
        66,
        {{2, 2}, {4, 2}, {2, 6}, {6, 6}, {2, 2}, {8, 4}, {4, 4}, {2, 2}, {10, 2}, {2, 2}, {4, 8}, {2, 4}})));
    return true;
}();

void expect_tap(const BilinearTap& t, int32_t i0, int32_t i1, double l0, double l1) {
    EXPECT_EQ(t.i0, i0);
    EXPECT_EQ(t.i1, i1);
    EXPECT_DOUBLE_EQ(t.l0, l0);
    EXPECT_DOUBLE_EQ(t.l1, l1);
}

// PyTorch's half-pixel rule by hand: 2 -> 4 samples src = (i + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75,
// 1.25 (past the last input: one tap); 4 -> 2 samples src = 2 i + 0.5; 1 -> 3 samples all read input 0.
TEST(OpBilinearResize, TapsFollowPyTorchsHalfPixelRule) {
    const std::vector<BilinearTap> up = bilinear_taps(2, 4);
    ASSERT_EQ(up.size(), 4u);
    expect_tap(up[0], 0, 0, 1.0, 0.0);
    expect_tap(up[1], 0, 1, 0.75, 0.25);
    expect_tap(up[2], 0, 1, 0.25, 0.75);
    expect_tap(up[3], 1, 1, 1.0, 0.0);
    const std::vector<BilinearTap> down = bilinear_taps(4, 2);
    expect_tap(down[0], 0, 1, 0.5, 0.5);
    expect_tap(down[1], 2, 3, 0.5, 0.5);
    for (const BilinearTap& t : bilinear_taps(1, 3)) expect_tap(t, 0, 0, 1.0, 0.0);
    for (int64_t i = 0; i < 5; ++i) expect_tap(bilinear_taps(5, 5)[i], i, i, 1.0, 0.0);
    // The transpose lists each (output, weight) of the taps under its input.
    const BilinearSources s = bilinear_sources(2, 4);
    EXPECT_EQ(s.first, (std::vector<int32_t>{0, 3, 6}));
    EXPECT_EQ(s.out, (std::vector<int32_t>{0, 1, 2, 1, 2, 3}));
    EXPECT_EQ(s.weight, (std::vector<double>{1.0, 0.75, 0.25, 0.25, 0.75, 1.0}));
}

// A grid equal to the table is the table itself, bit for bit, also packed after and before resized images; and
// every image's rows are the same as when it is resized alone.
TEST(OpBilinearResize, SameGridIsExactCopyAndImagesAreIndependent) {
    for (DType dtype : {DType::f32, DType::f64}) {
        const int64_t hm = 7, wm = 5, c = 3;
        const Tensor table = op_randn({hm, wm, c}, 31, 0).to(dtype);
        const ImageGrids grids = {{3, 4}, {7, 5}, {9, 2}};
        const Tensor y = Tensor::zeros({grids_patches(grids), c}, dtype);
        bilinear_resize_fwd(table, grids_tensor(grids), y);
        EXPECT_TRUE(op_same_bytes(y.slice(0, 12, 47).clone(), table.reshape({hm * wm, c})));
        int64_t first = 0;
        for (const auto& g : grids) {
            const int64_t rows = int64_t{g.first} * g.second;
            const Tensor alone = Tensor::zeros({rows, c}, dtype);
            bilinear_resize_fwd(table, grids_tensor({g}), alone);
            EXPECT_TRUE(op_same_bytes(y.slice(0, first, first + rows).clone(), alone));
            first += rows;
        }
    }
}

// The backward of a same-size grid adds dy to the table gradient exactly.
TEST(OpBilinearResize, SameGridBackwardAddsDyExactly) {
    const Tensor dy = op_randn({6, 2}, 37, 0).to(DType::f32), dtable = Tensor::zeros({3, 2, 2}, DType::f32);
    bilinear_resize_bwd(grids_tensor({{3, 2}}), dy, dtable);
    EXPECT_TRUE(op_same_bytes(dtable.reshape({6, 2}), dy));
}

TEST(OpArgs, BilinearResizeShapesAndDtypes) {
    const Tensor t = Tensor::zeros({4, 3, 2}, DType::f32), y = Tensor::zeros({7, 2}, DType::f32);
    const Tensor g = grids_tensor({{1, 1}, {2, 3}});
    bilinear_resize_fwd(t, g, y);
    bilinear_resize_bwd(g, y, op_like(t));
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, grids_tensor({{1, 1}, {0, 6}}), y);
        },
        "bilinear_resize_fwd: image 1 has a 0x6 patch grid; h and w must be > 0");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, grids_tensor({{2, 2}}), y);
        },
        "bilinear_resize_fwd: the grids hold 4 patches but y has 7 rows");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, g, Tensor::zeros({7, 3}, DType::f32));
        },
        "bilinear_resize_fwd: y has shape [7, 3], expected [7, 2]");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(Tensor::zeros({0, 3, 2}, DType::f32), grids_tensor({}), y.slice(0, 0, 0));
        },
        "bilinear_resize_fwd: table has shape [0, 3, 2]; the table needs at least one row and one column");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, Tensor::zeros({2, 3}, DType::i32), y);
        },
        "bilinear_resize_fwd: grids has shape [2, 3], expected [n, 2]");
    expect_op_error([&] { bilinear_resize_fwd(t, g.to(DType::f32), y); },
                    "bilinear_resize_fwd: grids has dtype f32, expected i32");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, op_cuda_view({2, 2}, DType::i32), y);
        },
        "bilinear_resize_fwd: grids must be a host tensor");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(t, g, op_cuda_view({7, 2}, DType::f32));
        },
        "bilinear_resize_fwd: y is on cuda but table is on cpu");
    expect_op_error([&] { bilinear_resize_fwd(t.to(DType::i32), g, y); }, "bilinear_resize_fwd: table has dtype i32");
    expect_op_error([&] { bilinear_resize_fwd(t, g, y.to(DType::f64)); },
                    "bilinear_resize_fwd: y has dtype f64, expected f32 (the dtype of table)");
    expect_op_error(
        [&] {
            bilinear_resize_fwd(op_noncontiguous({4, 3, 2}, DType::f32), g, y);
        },
        "bilinear_resize_fwd: table must be contiguous");
    expect_op_error(
        [&] {
            bilinear_resize_bwd(g, y, Tensor::zeros({4, 3, 5}, DType::f32));
        },
        "bilinear_resize_bwd: dy has shape [7, 2], expected [7, 5]");
    expect_op_error([&] { bilinear_resize_bwd(g, y.to(DType::f64), op_like(t)); },
                    "bilinear_resize_bwd: dy has dtype f64, expected f32 (the dtype of dtable)");
}

}  // namespace
}  // namespace mt::ops::test
