// The vision tower's model FLOPs (nn/vision/vision_flops.h).
#include "nn/vision/vision_flops.h"

namespace mt::nn {

double vision_forward_flops(const VisionConfig& vision, int64_t d_model, const ImageGrid& grid) {
    const auto n = static_cast<double>(grid.patches());
    const auto d = static_cast<double>(vision.dim), f = static_cast<double>(vision.mlp);
    const auto dp = static_cast<double>(vision.projector_width());
    const double embed = 2.0 * n * static_cast<double>(vision.patch_values()) * d;
    const double block = n * (8.0 * d * d + 4.0 * d * f) + 4.0 * n * n * d;
    const double projector = n / 4.0 * (2.0 * 4.0 * d * dp + 2.0 * dp * static_cast<double>(d_model));
    return embed + static_cast<double>(vision.layers) * block + projector;
}

double vision_forward_flops(const VisionConfig& vision, int64_t d_model, const std::vector<ImageGrid>& grids) {
    double total = 0.0;
    for (const ImageGrid& g : grids) total += vision_forward_flops(vision, d_model, g);
    return total;
}

}  // namespace mt::nn
