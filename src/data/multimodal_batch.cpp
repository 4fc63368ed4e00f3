// Consistency check of an image+text batch (multimodal_batch.h).
#include "data/multimodal_batch.h"

#include "core/error.h"

namespace mt::data {

void multimodal_batch_check(const MultimodalBatch& batch, const ImageTokenIds& ids) {
    const int64_t n = batch.rows * batch.seq;
    MT_CHECK(batch.rows >= 0 && batch.seq >= 0, "batch of {} rows x {} tokens", batch.rows, batch.seq);
    MT_CHECK(std::ssize(batch.inputs) == n && std::ssize(batch.targets) == n && std::ssize(batch.modality) == n,
             "batch of {} x {}: inputs {}, targets {}, modality {}",
             batch.rows,
             batch.seq,
             batch.inputs.size(),
             batch.targets.size(),
             batch.modality.size());
    const ImageBatch& im = batch.images;
    int64_t patches = 0;
    for (const auto& g : im.grids) {
        MT_CHECK(g[0] > 0 && g[1] > 0 && g[0] % 2 == 0 && g[1] % 2 == 0, "image grid {}x{} must be even", g[0], g[1]);
        patches += g[0] * g[1];
    }
    MT_CHECK(im.values_per_patch > 0 || im.grids.empty(), "values_per_patch {}", im.values_per_patch);
    MT_CHECK(std::ssize(im.patches) == patches * im.values_per_patch,
             "patches hold {} values, the grids need {} patches x {}",
             im.patches.size(),
             patches,
             im.values_per_patch);
    size_t block = 0;
    for (int64_t r = 0; r < batch.rows; ++r) {
        int64_t open_at = -1, slots = 0;
        for (int64_t t = 0; t < batch.seq; ++t) {
            const int64_t i = r * batch.seq + t;
            const int32_t in = batch.inputs[static_cast<size_t>(i)];
            const int32_t tg = batch.targets[static_cast<size_t>(i)];
            MT_CHECK(batch.modality[static_cast<size_t>(i)] == (in == ids.img_pad ? 1 : 0),
                     "row {} column {}: modality {} for input {}",
                     r,
                     t,
                     batch.modality[static_cast<size_t>(i)],
                     in);
            MT_CHECK(tg == -1 || (in != ids.img_pad && in != ids.img_start && tg != ids.img_start &&
                                  tg != ids.img_pad && tg != ids.img_end && tg != ids.pad),
                     "row {} column {}: input {} has supervised target {}",
                     r,
                     t,
                     in,
                     tg);
            if (in == ids.img_start) {
                MT_CHECK(open_at < 0, "row {} column {}: <img_start> inside an image block", r, t);
                open_at = t;
                slots = 0;
            } else if (in == ids.img_pad) {
                MT_CHECK(open_at >= 0, "row {} column {}: <img_pad> outside an image block", r, t);
                ++slots;
            } else if (in == ids.img_end) {
                MT_CHECK(open_at >= 0, "row {} column {}: <img_end> without <img_start>", r, t);
                MT_CHECK(block < im.grids.size(), "row {} column {}: image block {} has no grid", r, t, block);
                const auto& g = im.grids[block];
                MT_CHECK(slots == (g[0] / 2) * (g[1] / 2),
                         "row {}: image block {} at column {} has {} slots, its grid {}x{} gives {}",
                         r,
                         block,
                         open_at,
                         slots,
                         g[0],
                         g[1],
                         (g[0] / 2) * (g[1] / 2));
                ++block;
                open_at = -1;
            } else {
                MT_CHECK(open_at < 0, "row {} column {}: token {} inside an image block", r, t, in);
            }
        }
        MT_CHECK(open_at < 0, "row {}: the image block at column {} is not closed in its row", r, open_at);
    }
    MT_CHECK(block == im.grids.size(), "{} image blocks in the rows, {} grids", block, im.grids.size());
}

}  // namespace mt::data
