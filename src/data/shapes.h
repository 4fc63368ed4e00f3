// Synthetic shapes dataset (multimodal.md §6, docs/shapes_dataset.md): noisy canvases with up to 9 colored shapes on
// a 3x3 grid, their word captions (or VQA questions), and the exact image-blind bound of each caption. The bound
// proves that pixels reach the loss: a model that beats it must be reading the image. Everything is a pure function
// of (seed, split, index) through Philox and integer arithmetic, so the bytes are the same on every platform.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/image_tokens.h"
#include "data/shapes_vocab.h"

namespace mt::data {

// ---- Scenes. ----
enum class ShapeColor : uint8_t { red, green, blue, yellow, magenta, cyan, white, orange };
enum class ShapeKind : uint8_t { circle, square, triangle, cross };
enum class ShapeSize : uint8_t { small, large };
inline constexpr int kShapeColors = 8;
inline constexpr int kShapeKinds = 4;
inline constexpr int kShapeCells = 9;  // row-major: top-left, top, top-right, left, center, right, bottom-left, ...
inline constexpr int kShapesMaxObjects = 9;
inline constexpr int kShapesJitterSteps = 1024;  // jitter is j / 1024 of the free room in the cell, j in 0..1024
inline constexpr std::array<int, 5> kShapesCanvasSizes = {112, 168, 224, 280, 336};

int32_t shapes_color_token(ShapeColor c);
int32_t shapes_kind_token(ShapeKind k);
int32_t shapes_size_token(ShapeSize s);
int32_t shapes_cell_token(int cell);
// The fixed RGB of a color.
std::array<uint8_t, 3> shapes_color_rgb(ShapeColor c);

// One object. Its box (center +- radius) sits inside its cell; jitter_x = 0 puts the box against the cell's left
// edge and kShapesJitterSteps against its right edge (likewise jitter_y, top to bottom). Positions are fractions of
// the cell, so one scene renders at any resolution.
struct ShapeObject {
    int cell = 4;
    ShapeColor color = ShapeColor::red;
    ShapeKind kind = ShapeKind::square;
    ShapeSize size = ShapeSize::large;
    int jitter_x = kShapesJitterSteps / 2;
    int jitter_y = kShapesJitterSteps / 2;
    bool operator==(const ShapeObject&) const = default;
};

// A scene: native canvas size, objects in row-major cell order (one per cell), and the background noise key.
// Noise of pixel (y, x) is drawn from Philox keyed by noise_key at column x, or W-1-x when noise_mirrored, so a
// mirrored image is exactly the render of the mirrored scene (shapes_flip_scene toggles the flag).
struct ShapesScene {
    int height = 224;
    int width = 224;
    std::vector<ShapeObject> objects;
    uint64_t noise_key = 0;
    bool noise_mirrored = false;
    bool operator==(const ShapesScene&) const = default;
};

// An RGB image, uint8, [height, width, 3] row-major.
struct ShapesImage {
    int height = 0;
    int width = 0;
    std::vector<uint8_t> rgb;
};

// ---- Options and the prior. ----
// data.shapes.* of multimodal.md §7, plus the debug-ladder stage:
//   1: one large square at the center, color random (over the colors allowed with square);
//   2: + shape random: (color, shape) uniform over the allowed pairs;
//   3: + cell random (one of 9);
//   4: the full set: K ~ U{1..max_objects} objects in a random K-subset of cells, size random.
// Canvas size, jitter and noise are random at every stage; the caption template is the same at every stage.
struct ShapesOptions {
    uint64_t seed = 0;
    int max_objects = 3;  // 1..9
    std::vector<std::pair<std::string, std::string>> held_out = {{"green", "triangle"}, {"cyan", "cross"}};
    int64_t val_size = 2000;
    std::string format = "caption";  // "caption" or "vqa"
    int stage = 4;                   // 1..4
    int max_canvas = 336;            // canvas sides are drawn from the sizes in kShapesCanvasSizes up to this one
};

// The generative prior of train and val: which (color, shape) pairs are allowed, the stage and max_objects.
struct ShapesPrior {
    int stage = 4;
    int max_objects = 3;
    int canvas_sizes = 5;  // H and W are uniform over the first canvas_sizes of kShapesCanvasSizes
    std::array<std::array<bool, kShapeKinds>, kShapeColors> allowed{};  // [color][kind]
    std::array<double, kShapeKinds> vqa_kind_prob{};                    // P(the VQA question asks about kind k)

    bool is_allowed(ShapeColor c, ShapeKind k) const {
        return allowed[static_cast<int>(c)][static_cast<int>(k)];
    }
    // A: the number of allowed pairs.
    int pairs() const;
    // A_c: the number of shapes allowed with color c.
    int kinds_of(ShapeColor c) const;
    // The number of colors allowed with shape k.
    int colors_of(ShapeKind k) const;
};

// Validates options (MT_CHECK naming the data.shapes field) and resolves the prior.
ShapesPrior shapes_make_prior(const ShapesOptions& options);

// ---- Splits and samples. ----
// Sample s of split p comes from Philox keyed by the seed, stream s, counter high word 0x53480000 + p.
enum class ShapesSplit : uint32_t { train = 0, val = 1, comp_val = 2 };

struct ShapesSample {
    ShapesScene scene;
    // Caption or question + answer, ending with <eos>; no <bos> and no image block (see shapes_sequence).
    std::vector<int32_t> text;
    // ln P_blind(text[i] | text[<i]) under the train/val prior (shapes_blind_logprobs); -inf where a comp-val token
    // has probability 0 under that prior.
    std::vector<double> blind_logprob;
    // Leading text tokens that form the VQA question (0 for captions); an answer-only loss masks them.
    int prompt_len = 0;
};

class ShapesDataset {
   public:
    // MT_CHECK naming the field on bad options.
    explicit ShapesDataset(ShapesOptions options);

    const ShapesOptions& options() const {
        return options_;
    }
    const ShapesPrior& prior() const {
        return prior_;
    }
    // Sample `index` of a split: train takes any index; val and comp-val take 0..val_size-1. comp-val scenes hold at
    // least one held-out pair (drawn with every pair allowed, kept when one is held out); train and val hold none.
    // @param[in] split  train, val or comp_val
    // @param[in] index  the sample; the same (seed, split, index) always gives the same sample
    ShapesSample sample(ShapesSplit split, uint64_t index) const;
    // The val bound: mean over the val samples of -sum(blind_logprob), nats per sample. Exact for that set.
    double val_bound() const;
    // Whether comp-val has scenes: some held-out pair is one this stage can draw (stage 1 draws squares only).
    bool comp_val_drawable() const {
        return comp_drawable_;
    }

   private:
    ShapesOptions options_;
    ShapesPrior prior_;
    ShapesPrior comp_prior_;      // every pair allowed, for comp-val
    bool comp_drawable_ = false;  // whether this stage can draw a held-out pair at all
};

// ---- Text. ----
// `there is one shape .` | `there are {two..nine} shapes .`, then `a {size} {color} {shape} at {cell} .` per object
// in row-major cell order, then <eos>.
std::vector<int32_t> shapes_caption(const ShapesScene& scene);
// `what color is the {shape} ? {color} . <eos>`; MT_CHECK that exactly one object has that shape. The question is
// the first 6 tokens.
std::vector<int32_t> shapes_vqa(const ShapesScene& scene, ShapeKind asked);
// (H/28)(W/28): the LM tokens of an H x W image after 14-pixel patches and the 2x2 pixel shuffle; MT_CHECK that both
// are multiples of 28.
int64_t shapes_image_tokens(int height, int width);
// `<bos> <img_start> [image_tokens x <img_pad>] <img_end> text...` (text ends with <eos>).
// @param[in] text          a caption or VQA text (ShapesSample::text)
// @param[in] image_tokens  m, from shapes_image_tokens
std::vector<int32_t> shapes_sequence(std::span<const int32_t> text, int64_t image_tokens);

// ---- Images (shapes_render.cpp). ----
// Renders a scene at any height x width (1..4096): background 16 + uniform integer noise in [-8, 8] per channel,
// shapes with 2x2 supersampling in exact integer geometry (no floating point, so the bytes are portable). Radius
// 0.2 (small) or 0.4 (large) of the cell side min(H, W)/3, so shapes are never stretched.
// @param[in] scene          any scene (its own height and width are ignored here)
// @param[in] height, width  the output size in pixels
ShapesImage shapes_render(const ShapesScene& scene, int height, int width);
// At the scene's native size.
ShapesImage shapes_render(const ShapesScene& scene);

// Pixel geometry of an object at height x width, in pixels (exact up to 1/122880 px).
struct ShapeGeometry {
    double center_x, center_y, radius;
};
ShapeGeometry shapes_object_geometry(const ShapeObject& object, int height, int width);

// ---- Horizontal flip. ----
// The canonical mirrored scene: left<->right cells swapped, jitter mirrored, objects re-sorted into row-major order,
// attributes unchanged, noise mirrored. An involution; shapes_render(flip(s)) == shapes_flip_image(render(s)).
ShapesScene shapes_flip_scene(const ShapesScene& scene);
// Mirrors the columns of an image.
ShapesImage shapes_flip_image(const ShapesImage& image);

// ---- The image-blind bound (shapes_bound.cpp). ----
// Per-token ln P_blind(text[i] | text[<i]) of a caption or VQA text under the prior (multimodal.md §6): P(is) =
// 1/M, P(are) = (M-1)/M, the count word 1/(M-1), size 1/2, color A_c/A, shape 1/A_c, cell C(8-c, r-1)/C(8-p, r), the
// VQA shape word vqa_kind_prob, its answer color 1/colors_of(shape), every other token 1; fixed attributes of stages
// 1-3 have probability 1 (stage 1: color 1/colors_of(square), shape 1). Tokens the prior cannot produce get -inf.
// MT_CHECK when the text is not a caption or VQA text of this grammar.
// @param[in] prior  the train/val prior (ShapesDataset::prior)
// @param[in] text   a caption or VQA text ending with <eos>
std::vector<double> shapes_blind_logprobs(const ShapesPrior& prior, std::span<const int32_t> text);
// Closed form -ln P(C) of a K-object caption: stage 4 ln M + ln C(9,K) + K ln(2A); stage 3 ln A + ln 9; stage 2
// ln A; stage 1 ln(colors allowed with square). Stages 1-3 need K = 1.
double shapes_bound_caption(const ShapesPrior& prior, int k);
// Its expectation over K: the expected blind loss per caption (12.8202 nats for A = 32, M = 3).
double shapes_bound_expected(const ShapesPrior& prior);

}  // namespace mt::data
