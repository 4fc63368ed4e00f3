// Image blocks inside an LM token sequence (multimodal.md §3): `<img_start> [m x <img_pad>] <img_end>`. This file
// holds the per-position loss mask and modality id that every image-text source shares, so the synthetic shapes set
// and later real image-text data supervise exactly the same positions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mt::data {

// The special ids that frame an image block; `pad` (optional, -1 = none) marks padding targets.
struct ImageTokenIds {
    int32_t img_start = -1;
    int32_t img_pad = -1;
    int32_t img_end = -1;
    int32_t pad = -1;
};

// Per position t of an LM row (input inputs[t] predicts target targets[t]):
//   modality[t]  = 1 when inputs[t] is an image slot (<img_pad>, replaced by a projector output), else 0;
//   loss_mask[t] = 1 iff targets[t] is a text token (none of img_start, img_pad, img_end, pad) and inputs[t] is
//                  neither an image slot nor <img_start>.
// So image slots and <img_start> are never supervised, the position whose input is <img_end> predicts the first
// text token after the image and is supervised, and the position that would predict <img_start> is not (where an
// image goes is the data's choice, not the model's). Works on any row, including one cut inside an image block.
// Source-specific masks (assistant-only SFT, answer-only VQA) are ANDed by the caller.
// @param[in]  inputs     [T] token ids
// @param[in]  targets    [T] token ids (usually inputs shifted by one)
// @param[in]  ids        the image ids of the vocabulary
// @param[out] loss_mask  [T] 0/1
// @param[out] modality   [T] 0 text, 1 image
void image_tokens_masks(std::span<const int32_t> inputs,
                        std::span<const int32_t> targets,
                        const ImageTokenIds& ids,
                        std::span<uint8_t> loss_mask,
                        std::span<uint8_t> modality);

// Masks of a whole sequence s[0..n): position t has input s[t] and target s[t+1], for t = 0..n-2.
struct ImageTokenMasks {
    std::vector<uint8_t> loss_mask;
    std::vector<uint8_t> modality;
};

// Same as image_tokens_masks over the n-1 positions of a sequence; also checks that the image blocks are well formed
// (every <img_pad> inside a block, blocks closed and not nested) and fails with MT_CHECK naming the position if not.
// @param[in] sequence  n >= 1 token ids
// @param[in] ids       the image ids of the vocabulary
ImageTokenMasks image_tokens_sequence_masks(std::span<const int32_t> sequence, const ImageTokenIds& ids);

}  // namespace mt::data
