// Training and eval batches of the synthetic shapes set (multimodal.md §3, §6; issue 30 item 7): whole samples
// `<bos> <img_start> [m x <img_pad>] <img_end> caption <eos>` packed into rows, targets masked by image_tokens_masks,
// and each sample's image rendered at its native size and cut into patches. A cursor over this rank's samples makes
// resume exact and keeps data-parallel ranks disjoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/image_prep.h"
#include "data/multimodal_batch.h"
#include "data/shapes.h"

namespace mt::data {

// What a sample shows the model: the plain sample, or one of the controls of multimodal.md §6 (docs/multimodal.md).
enum class ShapesViewKind : uint8_t {
    plain,      // the sample as drawn: <bos> <img_start> [image] <img_end> text
    text_only,  // <bos> text: the text-only twin (control 1), no image block at all
    zeroed,     // the image's normalised pixels set to 0 (control 2)
    shuffled,   // the image of the next sample of the split, index + 1 (mod val_size on val and comp-val), with this
                // sample's text (control 2): a derangement, so no sample sees its own image
    flipped,    // the mirrored scene and its canonical caption (shapes_flip_scene; control 4); VQA texts unchanged
    resized,    // the scene rendered at size x size (control 5)
};
struct ShapesView {
    ShapesViewKind kind = ShapesViewKind::plain;
    int size = 0;  // resized: the square side, a multiple of 28 in [28, 336]
    bool operator==(const ShapesView&) const = default;
};
// "plain", "text_only", "zeroed", "shuffled", "flipped", "res<size>" (e.g. "res112").
std::string shapes_view_name(const ShapesView& view);

class ShapesBatcher {
   public:
    // A stream over a split: this rank's k-th sample (k = 0, 1, 2, ...) is dataset index k * world + rank, so ranks
    // see disjoint samples and together see every index once. train takes any index; on val and comp-val the index
    // wraps modulo val_size (epochs over the fixed set; ranks stay disjoint within an epoch when world divides
    // val_size). MT_CHECK on bad options or 0 <= rank < world violated.
    // @param[in] options  data.shapes.* (seed, stage, held-out pairs, format)
    // @param[in] split    train, val or comp_val
    // @param[in] rank, world  data-parallel rank and size
    ShapesBatcher(const ShapesOptions& options, ShapesSplit split, int rank = 0, int world = 1);

    // Eval mode: this rank's samples are the indices k * world + rank below count (count <= val_size for val and
    // comp-val), and the set stops instead of wrapping, so an eval mean counts every sample exactly once. Once the
    // set is used up, next() fills the remaining rows (and any later batch) with <pad> only and exhausted() turns
    // true; set_cursor(0) runs the set again, giving the same batches bitwise.
    // @param[in] count  samples in the set (all ranks together)
    static ShapesBatcher fixed(
        const ShapesOptions& options, ShapesSplit split, int64_t count, int rank = 0, int world = 1);

    // Fills a batch of rows x seq tokens. Rows take whole samples in cursor order while they fit (a sample never
    // splits across rows, and is never skipped: the one that does not fit opens the next row, or the next batch);
    // the rest of a row is <pad> inputs with target -1. Per sample of length L at row offset o, position o + t has
    // input sequence[t] and target sequence[t + 1] where image_tokens_masks supervises it, else -1. Its last
    // position (input <eos>) has target -1: the next token belongs to another, independent sample, and the
    // image-blind bound is a sum over the caption tokens only. Images are rendered at the scene's own size (both
    // sides multiples of 28 by construction) and patchified with default normalisation into out->images in block
    // order. out's buffers are reused. Fails with exit 2 (usage) naming the sample's size and seq when a sample is
    // longer than a row (max_sample_tokens gives the bound up front).
    // @param[in]  rows  >= 1
    // @param[in]  seq   tokens per row, >= 2
    // @param[out] out   the batch, overwritten
    void next(int64_t rows, int64_t seq, MultimodalBatch* out);

    // The view of the following samples (default plain); forgets a sample prepared in another view.
    // MT_CHECK: a resized view's size is a multiple of 28 in [28, 336].
    void set_view(const ShapesView& view);
    const ShapesView& view() const {
        return view_;
    }

    // Samples of this rank consumed so far (the cursor k of the next sample). Saving it with a checkpoint and
    // calling set_cursor on resume reproduces the following batches bitwise.
    int64_t cursor() const {
        return cursor_;
    }
    void set_cursor(int64_t cursor);
    // Eval mode only: whether every sample of this rank has been consumed (always false for a stream).
    bool exhausted() const;
    // The dataset index of this rank's k-th sample (-1 past the end of an eval set).
    int64_t sample_index(int64_t k) const;

    // The most tokens one sample of these options can take in a view: 3 + (max_canvas/28)^2 image slots (a resized
    // view: (size/28)^2; text-only: <bos> alone) + the longest text (a caption with max_objects objects, or a VQA
    // text). A row of at least this many tokens never fails.
    static int64_t max_sample_tokens(const ShapesOptions& options, const ShapesView& view = {});
    // The fewest tokens one sample can take in a view: 10 text-only (<bos> and the shortest text, a VQA one), else 32
    // (a 112x112 image's 16 slots and its three ids, and a one-object caption of 13).
    static int64_t min_sample_tokens(const ShapesView& view);

    const ShapesDataset& dataset() const {
        return dataset_;
    }
    ShapesSplit split() const {
        return split_;
    }

   private:
    // One sample ready to write: its token sequence, masks over its n - 1 positions, and its image.
    struct Prepared {
        int64_t k = -1;
        int64_t index = 0;
        std::vector<int32_t> sequence;
        ImageTokenMasks masks;
        ShapesImage image;  // empty in the text-only view
        int64_t image_tokens = 0;
        bool zero_pixels = false;
        double blind_nats = 0.0;  // -sum of the text's blind log-probabilities
    };
    const Prepared& prepare(int64_t k);

    ShapesDataset dataset_;
    ShapesSplit split_;
    int rank_ = 0;
    int world_ = 1;
    int64_t fixed_count_ = -1;  // -1: a stream
    int64_t cursor_ = 0;
    ShapesView view_;
    // The sample that did not fit the last row of the previous batch, kept so it is not generated twice.
    std::optional<Prepared> pending_;
};

}  // namespace mt::data
