// The word vocabulary of the synthetic shapes dataset (docs/shapes_dataset.md): 6 special ids, then 44 words. Cell
// names are single tokens ("top-left") and "." is a token, so a caption is a plain list of word ids; the image ids
// frame the image block that the LM splices projector outputs into (multimodal.md §3).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/image_tokens.h"

namespace mt::data {

// Special ids.
inline constexpr int32_t kShapesBos = 0;
inline constexpr int32_t kShapesEos = 1;
inline constexpr int32_t kShapesImgStart = 2;
inline constexpr int32_t kShapesImgPad = 3;
inline constexpr int32_t kShapesImgEnd = 4;
inline constexpr int32_t kShapesPad = 5;
// Words. Groups are contiguous and in enum order: count words one..nine, sizes small/large, the 8 colors, the 4
// shapes, the 9 cells in row-major order.
inline constexpr int32_t kShapesThere = 6;
inline constexpr int32_t kShapesIs = 7;
inline constexpr int32_t kShapesAre = 8;
inline constexpr int32_t kShapesCountFirst = 9;  // "one"; "nine" is 17
inline constexpr int32_t kShapesShape = 18;
inline constexpr int32_t kShapesShapes = 19;
inline constexpr int32_t kShapesDot = 20;
inline constexpr int32_t kShapesA = 21;
inline constexpr int32_t kShapesSizeFirst = 22;   // small, large
inline constexpr int32_t kShapesColorFirst = 24;  // red, green, blue, yellow, magenta, cyan, white, orange
inline constexpr int32_t kShapesKindFirst = 32;   // circle, square, triangle, cross
inline constexpr int32_t kShapesAt = 36;
inline constexpr int32_t kShapesCellFirst = 37;  // top-left ... bottom-right
inline constexpr int32_t kShapesWhat = 46;
inline constexpr int32_t kShapesColor = 47;
inline constexpr int32_t kShapesThe = 48;
inline constexpr int32_t kShapesQuestion = 49;
inline constexpr int32_t kShapesVocabSize = 50;

// The word of an id ("<bos>", "there", "top-left", "."); MT_CHECK on an id outside the vocabulary.
std::string_view shapes_token_word(int32_t id);
// The id of a word, or -1 when it is not in the vocabulary.
int32_t shapes_word_token(std::string_view word);
// Space-separated words to ids; MT_CHECK naming the first unknown word.
std::vector<int32_t> shapes_encode(std::string_view text);
// Ids to space-separated words (special ids spelled "<eos>" etc.).
std::string shapes_decode(std::span<const int32_t> ids);
// {img_start 2, img_pad 3, img_end 4, pad 5}, for image_tokens_masks.
ImageTokenIds shapes_image_token_ids();

}  // namespace mt::data
