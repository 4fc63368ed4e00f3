// The vision tower's FLOPs count (nn/vision/vision_flops.h) against a list of its matmuls written out one by one.
#include "nn/vision/vision_flops.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace mt::nn {
namespace {

// 2 m k n for each [m, k] x [k, n] product.
double matmul_flops(const std::vector<std::array<double, 3>>& products) {
    double sum = 0.0;
    for (const auto& [m, k, n] : products) sum += 2.0 * m * k * n;
    return sum;
}

TEST(VisionFlops, CountsEveryMatmulOfTheTower) {
    VisionConfig v;
    v.dim = 8;
    v.mlp = 24;
    v.layers = 3;
    v.heads = 2;
    v.projector_hidden = 40;
    const int64_t d_model = 16;
    const ImageGrid grid{4, 6};  // 24 patches, 6 LM tokens
    const double n = 24, d = 8, f = 24, dp = 40, heads = 2, hd = d / heads;
    std::vector<std::array<double, 3>> products = {{n, 588, d}};  // patch embedding
    for (int l = 0; l < 3; ++l) {
        for (int i = 0; i < 4; ++i) products.push_back({n, d, d});  // q, k, v, o
        products.push_back({n, d, f});                              // MLP up
        products.push_back({n, f, d});                              // MLP down
        for (int h = 0; h < heads; ++h) {
            products.push_back({n, hd, n});  // Q K^T of a head over the whole image
            products.push_back({n, n, hd});  // P V
        }
    }
    products.push_back({n / 4, 4 * d, dp});    // projector fc1 on the shuffled cells
    products.push_back({n / 4, dp, d_model});  // projector fc2
    EXPECT_DOUBLE_EQ(vision_forward_flops(v, d_model, grid), matmul_flops(products));
    // A batch is the sum of its images (the attention term is per image: packing adds no cross terms).
    const std::vector<ImageGrid> grids = {grid, {2, 2}, grid};
    EXPECT_DOUBLE_EQ(vision_forward_flops(v, d_model, grids),
                     2 * vision_forward_flops(v, d_model, grid) + vision_forward_flops(v, d_model, ImageGrid{2, 2}));
}

}  // namespace
}  // namespace mt::nn
