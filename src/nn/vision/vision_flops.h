// The model FLOPs of the vision tower (docs/PERFORMANCE.md "Vision"): what MFU counts for the ViT and the projector,
// the matmuls only (norms, GELU, RoPE and the softmax are not counted, as for the LM), one multiply-add = 2 FLOPs.
// Per image of n = h w patches, d = vision.dim, f = vision.mlp, L = vision.layers:
//   patch embedding    2 n (3 p^2) d
//   each block         n (8 d^2 + 4 d f)    q, k, v, o and the MLP's two matrices
//                      + 4 n^2 d            Q K^T and P V over the image's own patches (bidirectional: the full square)
//   projector          (n / 4) (2 (4 d) d_p + 2 d_p d_model)
// A training step is 3x the forward (the backward computes the gradients of both operands of every matmul).
#pragma once

#include <vector>

#include "nn/vision/vision_batch.h"
#include "nn/vision/vision_config.h"

namespace mt::nn {

double vision_forward_flops(const VisionConfig& vision, int64_t d_model, const ImageGrid& grid);
// Over the images of a batch.
double vision_forward_flops(const VisionConfig& vision, int64_t d_model, const std::vector<ImageGrid>& grids);

}  // namespace mt::nn
