// Exact match and per-attribute accuracy of the shapes controls (shapes_score.h).
#include "data/shapes_score.h"

#include "core/error.h"
#include "data/shapes.h"
#include "data/shapes_vocab.h"

namespace mt::data {

int shapes_token_attribute(int32_t id) {
    auto in = [id](int32_t first, int n) { return id >= first && id < first + n; };
    if (id == kShapesIs || id == kShapesAre || in(kShapesCountFirst, kShapesMaxObjects))
        return static_cast<int>(ShapesAttribute::count);
    if (in(kShapesSizeFirst, 2)) return static_cast<int>(ShapesAttribute::size);
    if (in(kShapesColorFirst, kShapeColors)) return static_cast<int>(ShapesAttribute::color);
    if (in(kShapesKindFirst, kShapeKinds)) return static_cast<int>(ShapesAttribute::shape);
    if (in(kShapesCellFirst, kShapeCells)) return static_cast<int>(ShapesAttribute::cell);
    return -1;
}

void ShapesScore::add(const ShapesScore& other) {
    samples += other.samples;
    exact += other.exact;
    for (int a = 0; a < kShapesAttributes; ++a) {
        attribute_tokens[a] += other.attribute_tokens[a];
        attribute_correct[a] += other.attribute_correct[a];
    }
}

double ShapesScore::exact_match() const {
    return samples > 0 ? static_cast<double>(exact) / static_cast<double>(samples) : 0.0;
}

double ShapesScore::accuracy(ShapesAttribute attribute) const {
    const auto a = static_cast<size_t>(attribute);
    return attribute_tokens[a] > 0
               ? static_cast<double>(attribute_correct[a]) / static_cast<double>(attribute_tokens[a])
               : 0.0;
}

void shapes_score_samples(std::span<const int32_t> targets,
                          std::span<const int32_t> predictions,
                          int64_t seq,
                          const std::vector<MultimodalBatchSample>& samples,
                          ShapesScore* score) {
    MT_CHECK(targets.size() == predictions.size(),
             "shapes score: {} targets but {} predictions",
             targets.size(),
             predictions.size());
    for (const MultimodalBatchSample& s : samples) {
        MT_CHECK(s.offset >= 0 && s.length >= 0 && s.offset + s.length <= seq &&
                     static_cast<size_t>((s.row + 1) * seq) <= targets.size(),
                 "shapes score: sample {} at row {} [{}, {}) lies outside the batch of rows of {} tokens",
                 s.index,
                 s.row,
                 s.offset,
                 s.offset + s.length,
                 seq);
        bool supervised = false, exact = true;
        for (int64_t t = s.offset; t < s.offset + s.length; ++t) {
            const auto i = static_cast<size_t>(s.row * seq + t);
            if (targets[i] < 0) continue;
            supervised = true;
            const bool right = predictions[i] == targets[i];
            exact = exact && right;
            const int a = shapes_token_attribute(targets[i]);
            if (a < 0) continue;
            score->attribute_tokens[static_cast<size_t>(a)] += 1;
            score->attribute_correct[static_cast<size_t>(a)] += right ? 1 : 0;
        }
        if (!supervised) continue;
        score->samples += 1;
        score->exact += exact ? 1 : 0;
    }
}

}  // namespace mt::data
