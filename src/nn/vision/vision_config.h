// The vision encoder's and the projector's shape (multimodal.md §1-§2, §7: the [vision] and [projector] keys). A
// ViT at native resolution: 14 x 14 patches, pre-norm LayerNorm blocks with bidirectional multi-head attention and a
// GELU MLP, 2-D RoPE or a learned position table; then a 2 x 2 pixel shuffle and a 2-layer MLP into the LM's hidden
// size.
#pragma once

#include <cstdint>
#include <string>

namespace mt::nn {

struct VisionConfig {
    int64_t patch = 14;  // pixels per patch side
    int64_t dim = 64;    // d_v
    int64_t layers = 0;  // L_v; 0: no vision encoder (the spec's tiny ViT has 2)
    int64_t heads = 4;   // attention heads, dim / heads each (divisible by 4 for the 2-D RoPE)
    int64_t mlp = 256;   // the MLP's hidden width
    // Patch positions: "rope2d" rotates q and k in every block; "learned" adds a [pos_grid, pos_grid, dim] table,
    // bilinearly resized to each image's grid (ops/bilinear_resize.h), to the patch embeddings, and the blocks rotate
    // nothing. 32 = 448 px / 14: vision.max_pixels' square side in patches, so the default images are resized down
    // or kept, and only larger or elongated ones are upsampled.
    std::string pos = "rope2d";
    int64_t pos_grid = 32;
    double rope_base = 10000.0;
    double norm_eps = 1e-6;  // LayerNorm eps (SigLIP's)
    double init_std = 0.02;
    int64_t projector_hidden = 0;  // d_p; 0: 4 dim
    // The <img_pad> id (vision.image_token): the model replaces the embedding of every such token of a batch with the
    // projector's outputs, in order (multimodal.md §3).
    int64_t image_token = -1;
    // The resize limits of images read from disk (multimodal.md §1): the area after the resize lies in
    // [min_pixels, max_pixels], both sides multiples of 2 * patch. Shapes images are rendered at their size.
    int64_t min_pixels = 112 * 112;
    int64_t max_pixels = 448 * 448;

    bool enabled() const {
        return layers > 0;
    }
    bool rope2d() const {
        return pos == "rope2d";
    }
    int64_t head_dim() const {
        return dim / heads;
    }
    // Values of one flattened patch: RGB, (row, column, channel) order.
    int64_t patch_values() const {
        return 3 * patch * patch;
    }
    int64_t projector_width() const {
        return projector_hidden > 0 ? projector_hidden : 4 * dim;
    }
};

}  // namespace mt::nn
