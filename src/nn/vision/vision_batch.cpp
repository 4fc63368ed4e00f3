// Packed-image bookkeeping of the vision encoder.
#include "nn/vision/vision_batch.h"

#include "core/error.h"

namespace mt::nn {

int64_t VisionBatch::num_patches() const {
    int64_t p = 0;
    for (const ImageGrid& g : grids) p += g.patches();
    return p;
}

int64_t VisionBatch::num_tokens() const {
    int64_t t = 0;
    for (const ImageGrid& g : grids) t += g.tokens();
    return t;
}

void VisionBatch::check(int64_t values, const char* what) const {
    for (size_t i = 0; i < grids.size(); ++i)
        MT_CHECK(grids[i].h > 0 && grids[i].w > 0 && grids[i].h % 2 == 0 && grids[i].w % 2 == 0,
                 "{}: image {} has a {}x{} patch grid; both sides must be even and positive (2x2 pixel shuffle)",
                 what,
                 i,
                 grids[i].h,
                 grids[i].w);
    MT_CHECK(patches.defined() && patches.ndim() == 2 && patches.size(0) == num_patches() && patches.size(1) == values,
             "{}: patches have shape {}, expected [{}, {}] (the grids' patches by 3 x patch^2 values)",
             what,
             patches.defined() ? core::shape_str(patches.shape()) : std::string("undefined"),
             num_patches(),
             values);
}

VisionPositions VisionPositions::make(const std::vector<ImageGrid>& grids, core::Device device) {
    int64_t p = 0;
    for (const ImageGrid& g : grids) p += g.patches();
    core::Tensor rows = core::Tensor::zeros({p}, core::DType::i32), cols = core::Tensor::zeros({p}, core::DType::i32);
    core::Tensor doc = core::Tensor::zeros({1, p}, core::DType::i32);
    core::Tensor grid = core::Tensor::zeros({static_cast<int64_t>(grids.size()), 2}, core::DType::i32);
    auto* r = rows.data<int32_t>();
    auto* c = cols.data<int32_t>();
    auto* d = doc.data<int32_t>();
    auto* gr = grid.data<int32_t>();
    int64_t at = 0;
    for (size_t i = 0; i < grids.size(); ++i) {
        const ImageGrid& g = grids[i];
        gr[2 * i] = static_cast<int32_t>(g.h);
        gr[2 * i + 1] = static_cast<int32_t>(g.w);
        const int64_t first = at;
        for (int64_t y = 0; y < g.h; ++y)
            for (int64_t x = 0; x < g.w; ++x, ++at) {
                r[at] = static_cast<int32_t>(y);
                c[at] = static_cast<int32_t>(x);
                d[at] = static_cast<int32_t>(first);
            }
    }
    return {rows.to_device(device), cols.to_device(device), doc.to_device(device), grid};
}

}  // namespace mt::nn
