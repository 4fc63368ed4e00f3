// Shapes batches: sample cursor, greedy whole-sample row packing, masked targets and patchified images
// (shapes_batcher.h).
#include "data/shapes_batcher.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace mt::data {

namespace {

const char* split_name(ShapesSplit split) {
    switch (split) {
        case ShapesSplit::train:
            return "train";
        case ShapesSplit::val:
            return "val";
        case ShapesSplit::comp_val:
            return "comp-val";
    }
    return "?";
}

}  // namespace

ShapesBatcher::ShapesBatcher(const ShapesOptions& options, ShapesSplit split, int rank, int world)
    : dataset_(options), split_(split), rank_(rank), world_(world) {
    MT_CHECK(world >= 1 && rank >= 0 && rank < world, "shapes batcher rank {} of world {}", rank, world);
}

ShapesBatcher ShapesBatcher::fixed(
    const ShapesOptions& options, ShapesSplit split, int64_t count, int rank, int world) {
    ShapesBatcher b(options, split, rank, world);
    MT_CHECK(count >= 0, "shapes eval set of {} samples", count);
    MT_CHECK(split == ShapesSplit::train || count <= options.val_size,
             "shapes eval set of {} {} samples, but data.shapes.val_size is {}",
             count,
             split_name(split),
             options.val_size);
    b.fixed_count_ = count;
    return b;
}

void ShapesBatcher::set_cursor(int64_t cursor) {
    MT_CHECK(cursor >= 0, "shapes batcher cursor {} must be >= 0", cursor);
    cursor_ = cursor;
    pending_.reset();
}

int64_t ShapesBatcher::sample_index(int64_t k) const {
    const int64_t index = k * world_ + rank_;
    if (fixed_count_ >= 0) return index < fixed_count_ ? index : -1;
    return split_ == ShapesSplit::train ? index : index % dataset_.options().val_size;
}

bool ShapesBatcher::exhausted() const {
    return sample_index(cursor_) < 0;
}

int64_t ShapesBatcher::max_sample_tokens(const ShapesOptions& options, const ShapesView& view) {
    // Caption: `there is one shape .` (5), 7 tokens per object, <eos>. VQA: `what color is the X ? c . <eos>` (9).
    const int64_t text = options.format == "vqa" ? 9 : 6 + 7 * int64_t{options.max_objects};
    if (view.kind == ShapesViewKind::text_only) return 1 + text;
    const int64_t side = (view.kind == ShapesViewKind::resized ? view.size : options.max_canvas) / kImageMultiple;
    return 3 + side * side + text;
}

std::string shapes_view_name(const ShapesView& view) {
    switch (view.kind) {
        case ShapesViewKind::plain:
            return "plain";
        case ShapesViewKind::text_only:
            return "text_only";
        case ShapesViewKind::zeroed:
            return "zeroed";
        case ShapesViewKind::shuffled:
            return "shuffled";
        case ShapesViewKind::flipped:
            return "flipped";
        case ShapesViewKind::resized:
            return "res" + std::to_string(view.size);
    }
    return "?";
}

void ShapesBatcher::set_view(const ShapesView& view) {
    MT_CHECK(
        view.kind != ShapesViewKind::resized ||
            (view.size >= kImageMultiple && view.size <= kShapesCanvasSizes.back() && view.size % kImageMultiple == 0),
        "shapes view res{}: the size must be a multiple of {} in [{}, {}]",
        view.size,
        kImageMultiple,
        kImageMultiple,
        kShapesCanvasSizes.back());
    view_ = view;
    pending_.reset();
}

int64_t ShapesBatcher::min_sample_tokens(const ShapesView& view) {
    return view.kind == ShapesViewKind::text_only ? 10 : 32;
}

const ShapesBatcher::Prepared& ShapesBatcher::prepare(int64_t k) {
    if (pending_ && pending_->k == k) return *pending_;
    Prepared p;
    p.k = k;
    p.index = sample_index(k);
    ShapesSample s = dataset_.sample(split_, static_cast<uint64_t>(p.index));
    switch (view_.kind) {
        case ShapesViewKind::text_only:
            break;
        case ShapesViewKind::plain:
        case ShapesViewKind::zeroed:
            p.image = shapes_render(s.scene);
            break;
        case ShapesViewKind::shuffled: {
            const int64_t other =
                split_ == ShapesSplit::train ? p.index + 1 : (p.index + 1) % dataset_.options().val_size;
            p.image = shapes_render(dataset_.sample(split_, static_cast<uint64_t>(other)).scene);
            break;
        }
        case ShapesViewKind::flipped:
            s.scene = shapes_flip_scene(s.scene);
            if (dataset_.options().format == "caption") {
                s.text = shapes_caption(s.scene);
                s.blind_logprob = shapes_blind_logprobs(dataset_.prior(), s.text);
            }
            p.image = shapes_render(s.scene);
            break;
        case ShapesViewKind::resized:
            p.image = shapes_render(s.scene, view_.size, view_.size);
            break;
    }
    for (double lp : s.blind_logprob) p.blind_nats -= lp;
    if (view_.kind == ShapesViewKind::text_only) {
        p.sequence.reserve(s.text.size() + 1);
        p.sequence.push_back(kShapesBos);
        p.sequence.insert(p.sequence.end(), s.text.begin(), s.text.end());
    } else {
        p.image_tokens = shapes_image_tokens(p.image.height, p.image.width);
        p.sequence = shapes_sequence(s.text, p.image_tokens);
    }
    p.zero_pixels = view_.kind == ShapesViewKind::zeroed;
    p.masks = image_tokens_sequence_masks(p.sequence, shapes_image_token_ids());
    pending_ = std::move(p);
    return *pending_;
}

void ShapesBatcher::next(int64_t rows, int64_t seq, MultimodalBatch* out) {
    MT_CHECK(out != nullptr, "shapes batcher: null batch");
    MT_CHECK(rows >= 1 && seq >= 2, "shapes batch of {} rows x {} tokens (need >= 1 x 2)", rows, seq);
    const size_t n = static_cast<size_t>(rows * seq);
    out->rows = rows;
    out->seq = seq;
    out->inputs.assign(n, kShapesPad);
    out->targets.assign(n, -1);
    out->modality.assign(n, 0);
    out->images.patches.clear();
    out->images.grids.clear();
    out->images.values_per_patch = image_patch_values(kImagePatch);
    out->samples.clear();
    out->stats = MultimodalBatchStats{};
    const ImagePatchOptions patch_options;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t offset = 0;
        while (!exhausted()) {
            const Prepared& p = prepare(cursor_);
            const int64_t length = std::ssize(p.sequence);
            if (offset + length > seq && offset > 0) break;  // opens the next row or batch: never split or skipped
            // Checked where the sample would open a row, so the error comes from the batch that was to hold it.
            if (length > seq)
                core::fail_hint(core::ExitCode::usage,
                                "raise the sequence length to at least " +
                                    std::to_string(max_sample_tokens(dataset_.options())) +
                                    " (the longest sample these data.shapes options can draw)",
                                "shapes {} sample {} is {} tokens ({}x{} image: {} image tokens, {} text tokens), "
                                "longer than a row of seq = {} tokens",
                                split_name(split_),
                                p.index,
                                length,
                                p.image.height,
                                p.image.width,
                                p.image_tokens,
                                length - 3 - p.image_tokens,
                                seq);
            const size_t base = static_cast<size_t>(r * seq + offset);
            for (int64_t t = 0; t < length; ++t) {
                const size_t i = base + static_cast<size_t>(t);
                out->inputs[i] = p.sequence[static_cast<size_t>(t)];
                if (t + 1 < length) {
                    const bool supervised = p.masks.loss_mask[static_cast<size_t>(t)] != 0;
                    out->targets[i] = supervised ? p.sequence[static_cast<size_t>(t + 1)] : -1;
                    out->modality[i] = p.masks.modality[static_cast<size_t>(t)];
                    out->stats.supervised_tokens += supervised ? 1 : 0;
                }
            }
            if (p.image_tokens > 0) {
                const int64_t grid_h = p.image.height / kImagePatch, grid_w = p.image.width / kImagePatch;
                const size_t at = out->images.patches.size();
                out->images.patches.resize(at + static_cast<size_t>(grid_h * grid_w * out->images.values_per_patch));
                float* patches = &out->images.patches[at];
                if (p.zero_pixels)
                    std::fill(patches, out->images.patches.data() + out->images.patches.size(), 0.0f);
                else
                    image_patchify(p.image.rgb.data(), p.image.height, p.image.width, patch_options, patches);
                out->images.grids.push_back({grid_h, grid_w});
                out->stats.images += 1;
            }
            out->samples.push_back(MultimodalBatchSample{p.index, r, offset, length, p.blind_nats});
            out->stats.image_tokens += p.image_tokens;
            out->stats.text_tokens += length - p.image_tokens;
            out->stats.samples += 1;
            offset += length;
            ++cursor_;
            pending_.reset();
        }
        out->stats.pad_tokens += seq - offset;
    }
}

}  // namespace mt::data
