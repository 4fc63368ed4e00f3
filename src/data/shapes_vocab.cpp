// The shapes word vocabulary: a fixed table, so ids never depend on options or on a tokenizer file.
#include "data/shapes_vocab.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace mt::data {

namespace {
constexpr std::array<std::string_view, kShapesVocabSize> kWords = {
    "<bos>",        "<eos>",    "<img_start>", "<img_pad>", "<img_end>", "<pad>",  "there",  "is",          "are",
    "one",          "two",      "three",       "four",      "five",      "six",    "seven",  "eight",       "nine",
    "shape",        "shapes",   ".",           "a",         "small",     "large",  "red",    "green",       "blue",
    "yellow",       "magenta",  "cyan",        "white",     "orange",    "circle", "square", "triangle",    "cross",
    "at",           "top-left", "top",         "top-right", "left",      "center", "right",  "bottom-left", "bottom",
    "bottom-right", "what",     "color",       "the",       "?"};

static_assert(kWords[kShapesThere] == "there" && kWords[kShapesCountFirst + 8] == "nine");
static_assert(kWords[kShapesSizeFirst] == "small" && kWords[kShapesColorFirst + 7] == "orange");
static_assert(kWords[kShapesKindFirst + 3] == "cross" && kWords[kShapesAt] == "at");
static_assert(kWords[kShapesCellFirst + 8] == "bottom-right" && kWords[kShapesQuestion] == "?");
}  // namespace

std::string_view shapes_token_word(int32_t id) {
    MT_CHECK(
        id >= 0 && id < kShapesVocabSize, "shapes token id {} outside the vocabulary 0..{}", id, kShapesVocabSize - 1);
    return kWords[static_cast<size_t>(id)];
}

int32_t shapes_word_token(std::string_view word) {
    for (size_t i = 0; i < kWords.size(); ++i)
        if (kWords[i] == word) return static_cast<int32_t>(i);
    return -1;
}

std::vector<int32_t> shapes_encode(std::string_view text) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    while (pos < text.size()) {
        if (text[pos] == ' ') {
            ++pos;
            continue;
        }
        const size_t end = std::min(text.find(' ', pos), text.size());
        const std::string_view word = text.substr(pos, end - pos);
        const int32_t id = shapes_word_token(word);
        MT_CHECK(id >= 0, "'{}' is not a shapes vocabulary word", word);
        ids.push_back(id);
        pos = end;
    }
    return ids;
}

std::string shapes_decode(std::span<const int32_t> ids) {
    std::string out;
    for (const int32_t id : ids) {
        if (!out.empty()) out += ' ';
        out += shapes_token_word(id);
    }
    return out;
}

ImageTokenIds shapes_image_token_ids() {
    return {kShapesImgStart, kShapesImgPad, kShapesImgEnd, kShapesPad};
}

}  // namespace mt::data
