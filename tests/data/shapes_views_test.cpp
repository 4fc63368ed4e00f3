// The views of the shapes controls (multimodal.md §6, data/shapes_batcher.h ShapesView) and their scoring
// (data/shapes_score.h): each view's tokens, image and blind bound against the generator's own functions, the
// canvas-size option, and exact match / per-attribute accuracy on hand-made predictions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"
#include "data/image_prep.h"
#include "data/shapes_batcher.h"
#include "data/shapes_score.h"

namespace mt::data {
namespace {

// One val sample alone in a row of `seq` tokens (the rest <pad>), in a view.
MultimodalBatch one_sample(const ShapesOptions& o, const ShapesView& view, int64_t index, int64_t seq = 512) {
    ShapesBatcher b = ShapesBatcher::fixed(o, ShapesSplit::val, index + 1);  // the set ends after this sample
    b.set_view(view);
    b.set_cursor(index);
    MultimodalBatch batch;
    b.next(1, seq, &batch);
    return batch;
}

// The sample's tokens (the row up to its length).
std::vector<int32_t> tokens_of(const MultimodalBatch& batch) {
    const MultimodalBatchSample& s = batch.samples.at(0);
    return {batch.inputs.begin() + s.offset, batch.inputs.begin() + s.offset + s.length};
}

std::vector<float> patches_of(const ShapesImage& image) {
    std::vector<float> out(static_cast<size_t>((image.height / 14) * (image.width / 14) * 588));
    image_patchify(image.rgb.data(), image.height, image.width, ImagePatchOptions{}, out.data());
    return out;
}

double blind_nats(const std::vector<double>& logprobs) {
    double n = 0.0;
    for (double lp : logprobs) n -= lp;
    return n;
}

const ShapesOptions kOptions{.seed = 11, .val_size = 64};

TEST(ShapesViews, PlainCarriesTheSampleAndItsBound) {
    for (int64_t i = 0; i < 8; ++i) {
        const ShapesSample s = ShapesDataset(kOptions).sample(ShapesSplit::val, static_cast<uint64_t>(i));
        const MultimodalBatch b = one_sample(kOptions, {}, i);
        EXPECT_EQ(tokens_of(b), shapes_sequence(s.text, shapes_image_tokens(s.scene.height, s.scene.width)));
        EXPECT_EQ(b.samples[0].reference_nats, blind_nats(s.blind_logprob));
        EXPECT_EQ(b.images.patches, patches_of(shapes_render(s.scene)));
    }
}

TEST(ShapesViews, TextOnlyDropsTheImageBlock) {
    const ShapesSample s = ShapesDataset(kOptions).sample(ShapesSplit::val, 3);
    const MultimodalBatch b = one_sample(kOptions, {ShapesViewKind::text_only}, 3);
    std::vector<int32_t> want = {kShapesBos};
    want.insert(want.end(), s.text.begin(), s.text.end());
    EXPECT_EQ(tokens_of(b), want);
    EXPECT_TRUE(b.images.grids.empty());
    EXPECT_TRUE(b.images.patches.empty());
    EXPECT_EQ(b.stats.image_tokens, 0);
    // The same supervised caption tokens as the plain view: <bos> predicts the first caption token as <img_end> does.
    const MultimodalBatch plain = one_sample(kOptions, {}, 3);
    EXPECT_EQ(b.stats.supervised_tokens, plain.stats.supervised_tokens);
    EXPECT_EQ(b.samples[0].reference_nats, plain.samples[0].reference_nats);
    EXPECT_EQ(ShapesBatcher::max_sample_tokens(kOptions, {ShapesViewKind::text_only}), 1 + 6 + 7 * 3);
}

TEST(ShapesViews, ZeroedKeepsTheLayoutAndZeroesThePixels) {
    const MultimodalBatch plain = one_sample(kOptions, {}, 5),
                          zeroed = one_sample(kOptions, {ShapesViewKind::zeroed}, 5);
    EXPECT_EQ(zeroed.inputs, plain.inputs);
    EXPECT_EQ(zeroed.targets, plain.targets);
    EXPECT_EQ(zeroed.images.grids, plain.images.grids);
    ASSERT_EQ(zeroed.images.patches.size(), plain.images.patches.size());
    for (float v : zeroed.images.patches) ASSERT_EQ(v, 0.0f);
}

TEST(ShapesViews, ShuffledShowsTheNextSamplesImageWithThisText) {
    const ShapesDataset ds(kOptions);
    for (const int64_t i : {int64_t{0}, int64_t{17}, kOptions.val_size - 1}) {  // the last wraps to sample 0
        const ShapesSample s = ds.sample(ShapesSplit::val, static_cast<uint64_t>(i));
        const ShapesSample other = ds.sample(ShapesSplit::val, static_cast<uint64_t>((i + 1) % kOptions.val_size));
        const MultimodalBatch b = one_sample(kOptions, {ShapesViewKind::shuffled}, i);
        EXPECT_EQ(tokens_of(b), shapes_sequence(s.text, shapes_image_tokens(other.scene.height, other.scene.width)));
        EXPECT_EQ(b.images.patches, patches_of(shapes_render(other.scene)));
        EXPECT_EQ(b.samples[0].reference_nats, blind_nats(s.blind_logprob));
    }
}

TEST(ShapesViews, FlippedShowsTheMirroredSceneWithItsCanonicalCaption) {
    const ShapesDataset ds(kOptions);
    int changed = 0;
    for (int64_t i = 0; i < 16; ++i) {
        const ShapesSample s = ds.sample(ShapesSplit::val, static_cast<uint64_t>(i));
        const ShapesScene flipped = shapes_flip_scene(s.scene);
        const std::vector<int32_t> caption = shapes_caption(flipped);
        const MultimodalBatch b = one_sample(kOptions, {ShapesViewKind::flipped}, i);
        EXPECT_EQ(tokens_of(b), shapes_sequence(caption, shapes_image_tokens(flipped.height, flipped.width)));
        // The mirrored image is the render of the mirrored scene (shapes_flip_scene's contract).
        EXPECT_EQ(b.images.patches, patches_of(shapes_flip_image(shapes_render(s.scene))));
        EXPECT_DOUBLE_EQ(b.samples[0].reference_nats, blind_nats(shapes_blind_logprobs(ds.prior(), caption)));
        changed += caption != s.text ? 1 : 0;
    }
    EXPECT_GT(changed, 0) << "no sample's caption changed under the flip: the view would test nothing";
}

TEST(ShapesViews, ResizedRendersTheSceneAtTheGivenSize) {
    const ShapesSample s = ShapesDataset(kOptions).sample(ShapesSplit::val, 9);
    for (const int size : {112, 336}) {
        const MultimodalBatch b = one_sample(kOptions, {ShapesViewKind::resized, size}, 9);
        EXPECT_EQ(tokens_of(b), shapes_sequence(s.text, (size / 28) * (size / 28)));
        ASSERT_EQ(b.images.grids.size(), 1u);
        EXPECT_EQ(b.images.grids[0], (std::array<int64_t, 2>{size / 14, size / 14}));
        EXPECT_EQ(b.images.patches, patches_of(shapes_render(s.scene, size, size)));
    }
    ShapesBatcher bad(kOptions, ShapesSplit::val);
    EXPECT_THROW(bad.set_view(ShapesView{.kind = ShapesViewKind::resized, .size = 100}), core::Error);
    EXPECT_EQ(shapes_view_name({ShapesViewKind::resized, 112}), "res112");
}

TEST(ShapesViews, MaxCanvasLimitsTheSizesAndKeepsTheDefaultStream) {
    ShapesOptions small = kOptions;
    small.max_canvas = 168;
    const ShapesDataset a(kOptions), b(small);
    std::set<int> sides;
    for (uint64_t i = 0; i < 200; ++i) {
        const ShapesScene s = b.sample(ShapesSplit::train, i).scene;
        sides.insert(s.height);
        sides.insert(s.width);
    }
    EXPECT_EQ(sides, (std::set<int>{112, 168}));
    EXPECT_EQ(ShapesBatcher::max_sample_tokens(small), 3 + 36 + 6 + 7 * 3);
    EXPECT_EQ(b.val_bound(), a.val_bound()) << "the canvas size must not change the captions' prior";
    ShapesOptions odd = kOptions;
    odd.max_canvas = 200;
    EXPECT_THROW(ShapesDataset{odd}, core::Error);
}

TEST(ShapesScore, ExactMatchAndAttributesOnHandMadePredictions) {
    // Two samples in one row of 12: sample A at [0, 6) supervises 3 targets (a color, a shape, a template word),
    // sample B at [6, 12) supervises 2 (a cell, a size); position 5 and 11 are the samples' last (unsupervised).
    const int64_t seq = 12;
    const int32_t red = kShapesColorFirst, circle = kShapesKindFirst, center = kShapesCellFirst + 4;
    const int32_t large = kShapesSizeFirst + 1;
    std::vector<int32_t> targets = {-1, red, circle, kShapesDot, -1, -1, -1, -1, center, large, -1, -1};
    std::vector<int32_t> pred = {7, red, circle, kShapesDot, 9, 9, 9, 9, center, large - 1, 9, 9};
    const std::vector<MultimodalBatchSample> samples = {{.index = 0, .row = 0, .offset = 0, .length = 6},
                                                        {.index = 1, .row = 0, .offset = 6, .length = 6}};
    ShapesScore score;
    shapes_score_samples(targets, pred, seq, samples, &score);
    EXPECT_EQ(score.samples, 2);
    EXPECT_EQ(score.exact, 1);  // A is right at every supervised position (unsupervised ones do not count); B is not
    EXPECT_EQ(score.exact_match(), 0.5);
    EXPECT_EQ(score.accuracy(ShapesAttribute::color), 1.0);
    EXPECT_EQ(score.accuracy(ShapesAttribute::shape), 1.0);
    EXPECT_EQ(score.accuracy(ShapesAttribute::cell), 1.0);
    EXPECT_EQ(score.accuracy(ShapesAttribute::size), 0.0);
    EXPECT_EQ(score.attribute_tokens[static_cast<size_t>(ShapesAttribute::count)], 0);
    // A sample with nothing supervised is not a sample of the score; one outside the batch is a bug.
    shapes_score_samples(targets, pred, seq, {{.index = 2, .row = 0, .offset = 4, .length = 2}}, &score);
    EXPECT_EQ(score.samples, 2);
    EXPECT_THROW(shapes_score_samples(targets, pred, seq, {{.index = 3, .row = 1, .offset = 0, .length = 2}}, &score),
                 core::Error);
    EXPECT_EQ(shapes_token_attribute(kShapesIs), static_cast<int>(ShapesAttribute::count));
    EXPECT_EQ(shapes_token_attribute(kShapesCountFirst + 8), static_cast<int>(ShapesAttribute::count));
    EXPECT_EQ(shapes_token_attribute(kShapesAt), -1);
    EXPECT_EQ(shapes_token_attribute(kShapesEos), -1);
}

}  // namespace
}  // namespace mt::data
