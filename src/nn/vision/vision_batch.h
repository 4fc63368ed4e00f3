// The images of one batch as the vision encoder takes them (multimodal.md §1): every image cut into patches and all
// images packed into one patch sequence (NaViT), each image a block of its own that no other image's patches attend
// to. The data pipeline fills patches and grids; VisionPositions derives what the kernels read on the device.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mt::nn {

// One image's patch grid: h rows by w columns of patches, both even (the 2 x 2 pixel shuffle).
struct ImageGrid {
    int64_t h = 0, w = 0;
    int64_t patches() const {
        return h * w;
    }
    // The LM tokens the image becomes after the pixel shuffle.
    int64_t tokens() const {
        return h * w / 4;
    }
};

struct VisionBatch {
    core::Tensor patches;          // [P, 3 patch^2] f32 on the host, normalised pixels; image after image, raster order
    std::vector<ImageGrid> grids;  // one per image, in the order of patches (and of the image slots in the tokens)

    bool empty() const {
        return grids.empty();
    }
    int64_t num_patches() const;
    int64_t num_tokens() const;
    // Checks the grids (even, positive) against patches: [sum of h w, values]. Names `what` in the error.
    void check(int64_t values, const char* what) const;
};

// Per-patch positions for the kernels: rows, cols [P] i32 (the patch's place in its grid, for the 2-D RoPE) and
// doc_start [1, P] i32 (the first patch of its image: the block-diagonal mask of the bidirectional attention) on
// `device`, and the grids [n, 2] i32 on the host (the pixel shuffle's metadata).
struct VisionPositions {
    core::Tensor rows, cols, doc_start, grids;
    static VisionPositions make(const std::vector<ImageGrid>& grids, core::Device device);
};

}  // namespace mt::nn
