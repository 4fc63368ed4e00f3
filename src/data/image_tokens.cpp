// Loss mask and modality id of image blocks in LM rows (multimodal.md §3).
#include "data/image_tokens.h"

#include "core/error.h"

namespace mt::data {

namespace {
bool is_text_target(int32_t t, const ImageTokenIds& ids) {
    return t != ids.img_start && t != ids.img_pad && t != ids.img_end && t != ids.pad;
}
}  // namespace

void image_tokens_masks(std::span<const int32_t> inputs,
                        std::span<const int32_t> targets,
                        const ImageTokenIds& ids,
                        std::span<uint8_t> loss_mask,
                        std::span<uint8_t> modality) {
    MT_CHECK(ids.img_start >= 0 && ids.img_pad >= 0 && ids.img_end >= 0,
             "image token ids must be set (img_start {}, img_pad {}, img_end {})",
             ids.img_start,
             ids.img_pad,
             ids.img_end);
    const size_t n = inputs.size();
    MT_CHECK(targets.size() == n && loss_mask.size() == n && modality.size() == n,
             "image token masks: inputs {}, targets {}, loss_mask {}, modality {} must have one length",
             n,
             targets.size(),
             loss_mask.size(),
             modality.size());
    for (size_t t = 0; t < n; ++t) {
        const bool image_slot = inputs[t] == ids.img_pad;
        modality[t] = image_slot ? 1 : 0;
        loss_mask[t] = (!image_slot && inputs[t] != ids.img_start && is_text_target(targets[t], ids)) ? 1 : 0;
    }
}

ImageTokenMasks image_tokens_sequence_masks(std::span<const int32_t> sequence, const ImageTokenIds& ids) {
    MT_CHECK(!sequence.empty(), "image token masks of an empty sequence");
    bool inside = false;
    for (size_t t = 0; t < sequence.size(); ++t) {
        const int32_t id = sequence[t];
        if (id == ids.img_start) {
            MT_CHECK(!inside, "<img_start> at position {} inside another image block", t);
            inside = true;
        } else if (id == ids.img_end) {
            MT_CHECK(inside, "<img_end> at position {} without an open image block", t);
            inside = false;
        } else {
            MT_CHECK(inside == (id == ids.img_pad),
                     "{} at position {}",
                     inside ? "text token inside an image block" : "<img_pad> outside an image block",
                     t);
        }
    }
    MT_CHECK(!inside, "image block opened but not closed by the end of the sequence ({} tokens)", sequence.size());
    const size_t n = sequence.size() - 1;
    ImageTokenMasks out{std::vector<uint8_t>(n), std::vector<uint8_t>(n)};
    image_tokens_masks(sequence.first(n), sequence.subspan(1), ids, out.loss_mask, out.modality);
    return out;
}

}  // namespace mt::data
