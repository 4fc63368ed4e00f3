// Scoring of the shapes controls (multimodal.md §6): greedy exact match and per-attribute accuracy of captions from
// the LM head's argmax under teacher forcing. Greedy decoding reproduces a caption exactly iff, fed the true prefix,
// the argmax at every supervised position is the true next token (by induction over the positions: while the greedy
// output equals the caption, its inputs are the teacher-forced ones), so one forward scores a whole batch.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "data/multimodal_batch.h"

namespace mt::data {

// What a caption token states: the count (`is`/`are` and the count word), or an object's size, color, shape or cell.
enum class ShapesAttribute : uint8_t { count, size, color, shape, cell };
inline constexpr int kShapesAttributes = 5;
inline constexpr std::array<const char*, kShapesAttributes> kShapesAttributeNames = {
    "count", "size", "color", "shape", "cell"};

// The attribute a target token states, or -1 for a template word (`there`, `a`, `at`, `.`, <eos>, VQA words).
int shapes_token_attribute(int32_t id);

struct ShapesScore {
    int64_t samples = 0;
    int64_t exact = 0;  // samples whose every supervised argmax is its target
    std::array<int64_t, kShapesAttributes> attribute_tokens{};
    std::array<int64_t, kShapesAttributes> attribute_correct{};

    void add(const ShapesScore& other);
    // exact / samples (0 with no samples).
    double exact_match() const;
    // attribute_correct / attribute_tokens of one attribute (0 with no such tokens).
    double accuracy(ShapesAttribute attribute) const;
};

// Adds the samples of one batch to a score. A sample's supervised positions are those of its span
// [offset, offset + length) in its row whose target is not -1; a sample without one is not counted.
// @param[in]     targets      [rows * seq] the batch's targets, -1 where not supervised
// @param[in]     predictions  [rows * seq] the LM head's argmax at each position
// @param[in]     seq          tokens per row
// @param[in]     samples      where each sample sits (rows counted from the batch's first)
// @param[in,out] score        added to
void shapes_score_samples(std::span<const int32_t> targets,
                          std::span<const int32_t> predictions,
                          int64_t seq,
                          const std::vector<MultimodalBatchSample>& samples,
                          ShapesScore* score);

}  // namespace mt::data
