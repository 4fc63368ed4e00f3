// The image-blind bound of the shapes set (multimodal.md §6). A caption is a bijective function of the scene, so the
// best a model without the image can do is the prior: its per-token conditionals are read off the caption left to
// right (shapes_blind_logprobs), and their sum is the closed form -ln P(C) (shapes_bound_caption).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "data/shapes.h"

namespace mt::data {

namespace {

constexpr double kNever = -std::numeric_limits<double>::infinity();

// Binomial coefficient, 0 outside 0 <= k <= n; exact for the n <= 9 used here.
double binom(int n, int k) {
    if (n < 0 || k < 0 || k > n) return 0;
    double r = 1;
    for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
    return r;
}

double log_or_never(double p) {
    return p > 0 ? std::log(p) : kNever;
}

// Walks a caption or VQA text token by token, appending ln P_blind of each.
class BlindReader {
   public:
    BlindReader(const ShapesPrior& prior, std::span<const int32_t> text) : prior_(prior), text_(text) {}

    std::vector<double> read() {
        MT_CHECK(!text_.empty(), "not a shapes caption or VQA text: it is empty");
        if (text_[0] == kShapesWhat)
            read_vqa();
        else
            read_caption();
        expect(kShapesEos);
        MT_CHECK(pos_ == text_.size(), "not a shapes caption or VQA text: {} tokens after <eos>", text_.size() - pos_);
        return std::move(out_);
    }

   private:
    std::string describe(int32_t id) const {
        return id >= 0 && id < kShapesVocabSize ? fmt::format("\"{}\"", shapes_token_word(id))
                                                : fmt::format("id {}", id);
    }
    int32_t take(std::string_view what) {
        MT_CHECK(pos_ < text_.size(), "not a shapes caption or VQA text: it ends where {} should be", what);
        return text_[pos_++];
    }
    // A fixed token: probability 1.
    void expect(int32_t id) {
        const int32_t t = take(shapes_token_word(id));
        MT_CHECK(t == id,
                 "not a shapes caption or VQA text: {} at token {} where \"{}\" should be",
                 describe(t),
                 pos_ - 1,
                 shapes_token_word(id));
        out_.push_back(0.0);
    }
    // A token of the word group [first, first + n): its index in the group.
    int group(int32_t first, int n, std::string_view what) {
        const int32_t t = take(what);
        MT_CHECK(t >= first && t < first + n,
                 "not a shapes caption or VQA text: {} at token {} where a {} should be",
                 describe(t),
                 pos_ - 1,
                 what);
        return t - first;
    }

    void read_caption() {
        const bool full = prior_.stage == 4;
        const int m = prior_.max_objects;
        expect(kShapesThere);
        int k = 1;
        const int32_t verb = take("\"is\" or \"are\"");
        if (verb == kShapesIs) {
            out_.push_back(full ? std::log(1.0 / m) : 0.0);
            expect(kShapesCountFirst);
            expect(kShapesShape);
        } else {
            MT_CHECK(verb == kShapesAre, "not a shapes caption: {} where \"is\" or \"are\" should be", describe(verb));
            out_.push_back(full && m > 1 ? std::log(static_cast<double>(m - 1) / m) : kNever);
            k = 1 + group(kShapesCountFirst, kShapesMaxObjects, "count word");
            MT_CHECK(k >= 2, "not a shapes caption: \"are one\"");
            out_.push_back(full && k <= m ? std::log(1.0 / (m - 1)) : kNever);
            expect(kShapesShapes);
        }
        expect(kShapesDot);
        const int square = static_cast<int>(ShapeKind::square);
        const int a = prior_.pairs();
        int prev = -1;
        for (int i = 0; i < k; ++i) {
            const int remaining = k - i;
            expect(kShapesA);
            const int size = group(kShapesSizeFirst, 2, "size");
            out_.push_back(full ? std::log(0.5) : (size == static_cast<int>(ShapeSize::large) ? 0.0 : kNever));
            const int c = group(kShapesColorFirst, kShapeColors, "color");
            const int a_c = prior_.kinds_of(static_cast<ShapeColor>(c));
            if (prior_.stage == 1)
                out_.push_back(prior_.allowed[c][square] ? -std::log(prior_.colors_of(ShapeKind::square)) : kNever);
            else
                out_.push_back(log_or_never(static_cast<double>(a_c) / a));
            const int kind = group(kShapesKindFirst, kShapeKinds, "shape");
            if (prior_.stage == 1)
                out_.push_back(kind == square && prior_.allowed[c][kind] ? 0.0 : kNever);
            else
                out_.push_back(prior_.allowed[c][kind] ? -std::log(a_c) : kNever);
            expect(kShapesAt);
            const int cell = group(kShapesCellFirst, kShapeCells, "cell");
            if (prior_.stage <= 2) {
                out_.push_back(cell == 4 ? 0.0 : kNever);
            } else {
                // Cells come in increasing order: after cell prev with `remaining` objects to place, cell c is next
                // in C(8-c, remaining-1) of the C(8-prev, remaining) equally likely completions.
                const double completions = cell > prev ? binom(8 - cell, remaining - 1) : 0.0;
                out_.push_back(log_or_never(completions / binom(8 - prev, remaining)));
            }
            prev = cell;
            expect(kShapesDot);
        }
    }

    void read_vqa() {
        for (const int32_t id : {kShapesWhat, kShapesColor, kShapesIs, kShapesThe}) expect(id);
        const int kind = group(kShapesKindFirst, kShapeKinds, "shape");
        out_.push_back(log_or_never(prior_.vqa_kind_prob[kind]));
        expect(kShapesQuestion);
        const int c = group(kShapesColorFirst, kShapeColors, "color");
        out_.push_back(prior_.allowed[c][kind] ? -std::log(prior_.colors_of(static_cast<ShapeKind>(kind))) : kNever);
        expect(kShapesDot);
    }

    const ShapesPrior& prior_;
    std::span<const int32_t> text_;
    size_t pos_ = 0;
    std::vector<double> out_;
};

}  // namespace

std::vector<double> shapes_blind_logprobs(const ShapesPrior& prior, std::span<const int32_t> text) {
    return BlindReader(prior, text).read();
}

double shapes_bound_caption(const ShapesPrior& prior, int k) {
    const double a = prior.pairs();
    if (prior.stage < 4) MT_CHECK(k == 1, "stage {} captions have one object, not {}", prior.stage, k);
    switch (prior.stage) {
        case 1:
            return std::log(prior.colors_of(ShapeKind::square));
        case 2:
            return std::log(a);
        case 3:
            return std::log(a) + std::log(static_cast<double>(kShapeCells));
        default:
            MT_CHECK(k >= 1 && k <= prior.max_objects, "K = {} outside 1..{}", k, prior.max_objects);
            return std::log(prior.max_objects) + std::log(binom(kShapeCells, k)) + k * std::log(2 * a);
    }
}

double shapes_bound_expected(const ShapesPrior& prior) {
    if (prior.stage < 4) return shapes_bound_caption(prior, 1);
    double sum = 0;
    for (int k = 1; k <= prior.max_objects; ++k) sum += shapes_bound_caption(prior, k);
    return sum / prior.max_objects;
}

}  // namespace mt::data
