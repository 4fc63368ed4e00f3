// Shapes generator: option checks, the prior, scene sampling from Philox, captions, VQA text and the horizontal flip.
// Random words become integers by Lemire's multiply-shift with rejection, which is exactly uniform; no std::
// distribution is used (their outputs are implementation-defined), so samples are the same on every platform.
#include "data/shapes.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace mt::data {

namespace {

constexpr uint32_t kStreamTag = 0x53480000u;  // "SH": keeps these draws apart from other Philox users of the seed
constexpr int kMaxAttempts = 1 << 20;
constexpr int kVqaPromptLen = 6;  // what color is the {shape} ?

constexpr std::array<std::array<uint8_t, 3>, kShapeColors> kRgb = {{
    {230, 30, 30},    // red
    {40, 200, 60},    // green
    {40, 90, 240},    // blue
    {240, 220, 40},   // yellow
    {220, 50, 220},   // magenta
    {40, 220, 230},   // cyan
    {245, 245, 245},  // white
    {250, 140, 20},   // orange
}};

// The random words of one sample: Philox keyed by the seed, counter (stream = index, high = tag + split, low =
// block), four words per block.
class WordStream {
   public:
    WordStream(uint64_t seed, ShapesSplit split, uint64_t index)
        : seed_(seed), index_(index), high_(uint64_t{kStreamTag + static_cast<uint32_t>(split)} << 32) {}

    uint32_t next() {
        if (pos_ == 4) {
            MT_CHECK(block_ < (uint64_t{1} << 32), "shapes sample {} drew 2^34 random words", index_);
            block_words_ = core::philox4x32(seed_, index_, high_ | block_++);
            pos_ = 0;
        }
        return block_words_[pos_++];
    }
    // Uniform on 0..n-1 exactly: the high word of word * n, rejecting the low words below 2^32 mod n.
    uint32_t below(uint32_t n) {
        uint64_t m = uint64_t{next()} * n;
        if (static_cast<uint32_t>(m) < n) {
            const uint32_t threshold = (0u - n) % n;
            while (static_cast<uint32_t>(m) < threshold) m = uint64_t{next()} * n;
        }
        return static_cast<uint32_t>(m >> 32);
    }
    uint64_t next_u64() {
        const uint64_t high = next();
        return (high << 32) | next();
    }

   private:
    uint64_t seed_, index_, high_, block_ = 0;
    std::array<uint32_t, 4> block_words_{};
    int pos_ = 4;
};

std::string_view kind_name(int k) {
    return shapes_token_word(kShapesKindFirst + k);
}

int find_word(std::string_view word, int32_t first, int count) {
    const int32_t id = shapes_word_token(word);
    return id >= first && id < first + count ? id - first : -1;
}

// The (color, kind) pairs a stage draws from, color-major: stage 1 only squares.
std::vector<std::pair<ShapeColor, ShapeKind>> drawable_pairs(const ShapesPrior& prior) {
    std::vector<std::pair<ShapeColor, ShapeKind>> pairs;
    for (int c = 0; c < kShapeColors; ++c)
        for (int k = 0; k < kShapeKinds; ++k)
            if (prior.allowed[c][k] && (prior.stage > 1 || k == static_cast<int>(ShapeKind::square)))
                pairs.emplace_back(static_cast<ShapeColor>(c), static_cast<ShapeKind>(k));
    return pairs;
}

// Draw order: H, W, K (stage 4), the cell subset (stages 3-4, partial Fisher-Yates), then per object the pair, the
// size (stage 4), jitter x and y; last the noise key.
ShapesScene draw_scene(WordStream& w, const ShapesPrior& prior) {
    ShapesScene s;
    const auto sizes = static_cast<uint32_t>(prior.canvas_sizes);
    s.height = kShapesCanvasSizes[w.below(sizes)];
    s.width = kShapesCanvasSizes[w.below(sizes)];
    const int k = prior.stage == 4 ? 1 + static_cast<int>(w.below(static_cast<uint32_t>(prior.max_objects))) : 1;
    std::array<int, kShapeCells> cells = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    if (prior.stage >= 3) {
        for (int i = 0; i < k; ++i) std::swap(cells[i], cells[i + w.below(static_cast<uint32_t>(kShapeCells - i))]);
        std::sort(cells.begin(), cells.begin() + k);
    } else {
        cells[0] = 4;
    }
    const auto pairs = drawable_pairs(prior);
    for (int i = 0; i < k; ++i) {
        ShapeObject o;
        o.cell = cells[i];
        const auto& pair = pairs[w.below(static_cast<uint32_t>(pairs.size()))];
        o.color = pair.first;
        o.kind = pair.second;
        o.size = prior.stage == 4 && w.below(2) == 0 ? ShapeSize::small : ShapeSize::large;
        o.jitter_x = static_cast<int>(w.below(kShapesJitterSteps + 1));
        o.jitter_y = static_cast<int>(w.below(kShapesJitterSteps + 1));
        s.objects.push_back(o);
    }
    s.noise_key = w.next_u64();
    return s;
}

// P(the VQA question asks about kind k) under the prior: enumerate the kinds of K objects (4^K tuples, K <= 9),
// keep the tuples with a unique kind, and ask one of the unique kinds uniformly. Colors do not enter: given the
// kinds they are independent and uniform over the allowed colors of each kind.
std::array<double, kShapeKinds> vqa_kind_probs(const ShapesPrior& prior) {
    std::array<double, kShapeKinds> q{}, num{};
    for (int k = 0; k < kShapeKinds; ++k)
        q[k] = prior.stage == 1 ? (k == static_cast<int>(ShapeKind::square) ? 1.0 : 0.0)
                                : static_cast<double>(prior.colors_of(static_cast<ShapeKind>(k))) / prior.pairs();
    const int k_max = prior.stage == 4 ? prior.max_objects : 1;
    double z = 0;
    for (int k = 1; k <= k_max; ++k) {
        const double p_k = 1.0 / k_max;
        int tuples = 1;
        for (int i = 0; i < k; ++i) tuples *= kShapeKinds;
        for (int t = 0; t < tuples; ++t) {
            std::array<int, kShapeKinds> count{};
            double p = p_k;
            for (int i = 0, rest = t; i < k; ++i, rest /= kShapeKinds) {
                ++count[rest % kShapeKinds];
                p *= q[rest % kShapeKinds];
            }
            const int unique = static_cast<int>(std::count(count.begin(), count.end(), 1));
            if (p == 0 || unique == 0) continue;
            z += p;
            for (int j = 0; j < kShapeKinds; ++j)
                if (count[j] == 1) num[j] += p / unique;
        }
    }
    MT_CHECK(z > 0, "no VQA question can be asked under this prior");
    for (double& v : num) v /= z;
    return num;
}

}  // namespace

int32_t shapes_color_token(ShapeColor c) {
    return kShapesColorFirst + static_cast<int32_t>(c);
}
int32_t shapes_kind_token(ShapeKind k) {
    return kShapesKindFirst + static_cast<int32_t>(k);
}
int32_t shapes_size_token(ShapeSize s) {
    return kShapesSizeFirst + static_cast<int32_t>(s);
}
int32_t shapes_cell_token(int cell) {
    MT_CHECK(cell >= 0 && cell < kShapeCells, "cell {} outside 0..8", cell);
    return kShapesCellFirst + cell;
}
std::array<uint8_t, 3> shapes_color_rgb(ShapeColor c) {
    return kRgb[static_cast<size_t>(c)];
}

int ShapesPrior::pairs() const {
    int a = 0;
    for (const auto& row : allowed) a += static_cast<int>(std::count(row.begin(), row.end(), true));
    return a;
}
int ShapesPrior::kinds_of(ShapeColor c) const {
    const auto& row = allowed[static_cast<int>(c)];
    return static_cast<int>(std::count(row.begin(), row.end(), true));
}
int ShapesPrior::colors_of(ShapeKind k) const {
    int n = 0;
    for (const auto& row : allowed) n += row[static_cast<int>(k)] ? 1 : 0;
    return n;
}

ShapesPrior shapes_make_prior(const ShapesOptions& options) {
    MT_CHECK(options.stage >= 1 && options.stage <= 4,
             "data.shapes.stage must be 1..4 (the debug ladder), got {}",
             options.stage);
    MT_CHECK(options.max_objects >= 1 && options.max_objects <= kShapesMaxObjects,
             "data.shapes.max_objects must be 1..9 (one object per cell of the 3x3 grid), got {}",
             options.max_objects);
    MT_CHECK(options.val_size >= 1, "data.shapes.val_size must be at least 1, got {}", options.val_size);
    MT_CHECK(options.format == "caption" || options.format == "vqa",
             "data.shapes.format must be \"caption\" or \"vqa\", got \"{}\"",
             options.format);
    const auto last = std::find(kShapesCanvasSizes.begin(), kShapesCanvasSizes.end(), options.max_canvas);
    MT_CHECK(last != kShapesCanvasSizes.end(),
             "data.shapes.max_canvas must be one of 112, 168, 224, 280, 336, got {}",
             options.max_canvas);
    ShapesPrior prior;
    prior.canvas_sizes = static_cast<int>(last - kShapesCanvasSizes.begin()) + 1;
    prior.stage = options.stage;
    prior.max_objects = options.max_objects;
    for (auto& row : prior.allowed) row.fill(true);
    for (size_t i = 0; i < options.held_out.size(); ++i) {
        const auto& [color, kind] = options.held_out[i];
        const int c = find_word(color, kShapesColorFirst, kShapeColors);
        const int k = find_word(kind, kShapesKindFirst, kShapeKinds);
        MT_CHECK(c >= 0,
                 "data.shapes.held_out[{}]: unknown color \"{}\" (red, green, blue, yellow, magenta, cyan, white, "
                 "orange)",
                 i,
                 color);
        MT_CHECK(k >= 0, "data.shapes.held_out[{}]: unknown shape \"{}\" (circle, square, triangle, cross)", i, kind);
        MT_CHECK(prior.allowed[c][k], "data.shapes.held_out[{}]: {} {} is listed twice", i, color, kind);
        prior.allowed[c][k] = false;
    }
    MT_CHECK(prior.pairs() > 0, "data.shapes.held_out holds out every (color, shape) pair");
    MT_CHECK(prior.stage > 1 || prior.colors_of(ShapeKind::square) > 0,
             "data.shapes.held_out holds out every square, and stage 1 draws only squares");
    prior.vqa_kind_prob = vqa_kind_probs(prior);
    return prior;
}

ShapesDataset::ShapesDataset(ShapesOptions options) : options_(std::move(options)) {
    prior_ = shapes_make_prior(options_);
    comp_prior_ = prior_;
    for (auto& row : comp_prior_.allowed) row.fill(true);
    comp_drawable_ = drawable_pairs(comp_prior_).size() > drawable_pairs(prior_).size();
}

ShapesSample ShapesDataset::sample(ShapesSplit split, uint64_t index) const {
    const bool comp = split == ShapesSplit::comp_val;
    if (split != ShapesSplit::train)
        MT_CHECK(index < static_cast<uint64_t>(options_.val_size),
                 "{} sample {} outside 0..{} (data.shapes.val_size)",
                 comp ? "comp-val" : "val",
                 index,
                 options_.val_size - 1);
    MT_CHECK(!comp || comp_drawable_,
             "comp-val needs a held-out pair that stage {} can draw (data.shapes.held_out; stage 1 draws squares only)",
             prior_.stage);
    const bool vqa = options_.format == "vqa";
    auto held_out = [&](const ShapeObject& o) { return !prior_.is_allowed(o.color, o.kind); };
    WordStream w(options_.seed, split, index);
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
        ShapesSample out;
        out.scene = draw_scene(w, comp ? comp_prior_ : prior_);
        const auto& objects = out.scene.objects;
        if (comp && std::none_of(objects.begin(), objects.end(), held_out)) continue;
        if (!vqa) {
            out.text = shapes_caption(out.scene);
        } else {
            // Ask about a kind that occurs once (on comp-val, one whose object is a held-out pair); redraw if none.
            std::vector<ShapeKind> candidates;
            for (const ShapeObject& o : objects) {
                const auto same = [&](const ShapeObject& x) { return x.kind == o.kind; };
                if (std::count_if(objects.begin(), objects.end(), same) == 1 && (!comp || held_out(o)))
                    candidates.push_back(o.kind);
            }
            if (candidates.empty()) continue;
            out.text = shapes_vqa(out.scene, candidates[w.below(static_cast<uint32_t>(candidates.size()))]);
            out.prompt_len = kVqaPromptLen;
        }
        out.blind_logprob = shapes_blind_logprobs(prior_, out.text);
        return out;
    }
    MT_CHECK(false, "shapes sample {} found no acceptable scene in {} draws", index, kMaxAttempts);
    return {};
}

double ShapesDataset::val_bound() const {
    double total = 0;
    for (int64_t i = 0; i < options_.val_size; ++i) {
        const ShapesSample s = sample(ShapesSplit::val, static_cast<uint64_t>(i));
        double nll = 0;
        for (const double lp : s.blind_logprob) nll -= lp;
        total += nll;
    }
    return total / static_cast<double>(options_.val_size);
}

std::vector<int32_t> shapes_caption(const ShapesScene& scene) {
    const int k = static_cast<int>(scene.objects.size());
    MT_CHECK(k >= 1 && k <= kShapesMaxObjects, "a shapes caption needs 1..9 objects, the scene has {}", k);
    std::vector<int32_t> out = {kShapesThere};
    if (k == 1)
        out.insert(out.end(), {kShapesIs, kShapesCountFirst, kShapesShape, kShapesDot});
    else
        out.insert(out.end(), {kShapesAre, kShapesCountFirst + k - 1, kShapesShapes, kShapesDot});
    int prev = -1;
    for (const ShapeObject& o : scene.objects) {
        MT_CHECK(o.cell > prev && o.cell < kShapeCells, "scene objects must be in increasing cell order");
        prev = o.cell;
        out.insert(out.end(),
                   {kShapesA,
                    shapes_size_token(o.size),
                    shapes_color_token(o.color),
                    shapes_kind_token(o.kind),
                    kShapesAt,
                    shapes_cell_token(o.cell),
                    kShapesDot});
    }
    out.push_back(kShapesEos);
    return out;
}

std::vector<int32_t> shapes_vqa(const ShapesScene& scene, ShapeKind asked) {
    const ShapeObject* found = nullptr;
    int count = 0;
    for (const ShapeObject& o : scene.objects)
        if (o.kind == asked) {
            found = &o;
            ++count;
        }
    MT_CHECK(count == 1, "VQA asks about a {} but the scene has {} of them", kind_name(static_cast<int>(asked)), count);
    return {kShapesWhat,
            kShapesColor,
            kShapesIs,
            kShapesThe,
            shapes_kind_token(asked),
            kShapesQuestion,
            shapes_color_token(found->color),
            kShapesDot,
            kShapesEos};
}

int64_t shapes_image_tokens(int height, int width) {
    MT_CHECK(height > 0 && width > 0 && height % 28 == 0 && width % 28 == 0,
             "image {}x{}: both sides must be positive multiples of 28 (two 14-pixel patches)",
             height,
             width);
    return int64_t{height / 28} * (width / 28);
}

std::vector<int32_t> shapes_sequence(std::span<const int32_t> text, int64_t image_tokens) {
    MT_CHECK(image_tokens >= 0, "negative image token count {}", image_tokens);
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(image_tokens) + text.size() + 3);
    out.push_back(kShapesBos);
    out.push_back(kShapesImgStart);
    out.insert(out.end(), static_cast<size_t>(image_tokens), kShapesImgPad);
    out.push_back(kShapesImgEnd);
    out.insert(out.end(), text.begin(), text.end());
    return out;
}

ShapesScene shapes_flip_scene(const ShapesScene& scene) {
    ShapesScene out = scene;
    for (ShapeObject& o : out.objects) {
        o.cell = o.cell / 3 * 3 + (2 - o.cell % 3);
        o.jitter_x = kShapesJitterSteps - o.jitter_x;
    }
    std::sort(out.objects.begin(), out.objects.end(), [](const ShapeObject& a, const ShapeObject& b) {
        return a.cell < b.cell;
    });
    out.noise_mirrored = !scene.noise_mirrored;
    return out;
}

}  // namespace mt::data
