// Shapes batches (multimodal.md §3, §6): the layout and targets of a known sample, packing whole samples into rows,
// the cursor (a sample that does not fit opens the next batch; resume is bitwise), disjoint data-parallel ranks,
// images in block order with patches matching their grids, stats, and the eval mode that stops.
#include "data/shapes_batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;

const ImageTokenIds kIds = shapes_image_token_ids();

// The token sequence of a split's sample, as the batcher must lay it out.
std::vector<int32_t> sequence_of(const ShapesDataset& ds, ShapesSplit split, int64_t index) {
    const ShapesSample s = ds.sample(split, static_cast<uint64_t>(index));
    return shapes_sequence(s.text, shapes_image_tokens(s.scene.height, s.scene.width));
}

int64_t length_of(const ShapesDataset& ds, ShapesSplit split, int64_t index) {
    return std::ssize(sequence_of(ds, split, index));
}

void expect_same(const MultimodalBatch& a, const MultimodalBatch& b) {
    EXPECT_EQ(a.rows, b.rows);
    EXPECT_EQ(a.seq, b.seq);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.targets, b.targets);
    EXPECT_EQ(a.modality, b.modality);
    EXPECT_EQ(a.images.grids, b.images.grids);
    ASSERT_EQ(a.images.patches.size(), b.images.patches.size());
    EXPECT_EQ(std::memcmp(a.images.patches.data(), b.images.patches.data(), a.images.patches.size() * sizeof(float)),
              0);
    ASSERT_EQ(a.samples.size(), b.samples.size());
    for (size_t i = 0; i < a.samples.size(); ++i) {
        EXPECT_EQ(a.samples[i].index, b.samples[i].index);
        EXPECT_EQ(a.samples[i].row, b.samples[i].row);
        EXPECT_EQ(a.samples[i].offset, b.samples[i].offset);
    }
}

TEST(ShapesBatcherLayout, FirstRowIsTheFirstSampleWithMaskedTargets) {
    const ShapesOptions o{.seed = 7};
    ShapesBatcher b(o, ShapesSplit::train);
    const ShapesSample s = b.dataset().sample(ShapesSplit::train, 0);
    const int64_t m = shapes_image_tokens(s.scene.height, s.scene.width);
    const int64_t len = 3 + m + std::ssize(s.text);
    MultimodalBatch batch;
    b.next(1, len, &batch);  // exactly one sample fills the row
    ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(len));
    EXPECT_EQ(batch.inputs, sequence_of(b.dataset(), ShapesSplit::train, 0));
    EXPECT_EQ(batch.inputs[0], kShapesBos);
    EXPECT_EQ(batch.inputs[1], kShapesImgStart);
    EXPECT_EQ(batch.inputs[2 + m], kShapesImgEnd);
    EXPECT_EQ(batch.inputs[len - 1], kShapesEos);
    // Per position type: <bos> (predicts <img_start>), <img_start>, image slots: ignored; <img_end> predicts the first
    // caption token; caption tokens predict the next one; <eos> (last) is ignored.
    EXPECT_EQ(batch.targets[0], -1);
    EXPECT_EQ(batch.targets[1], -1);
    for (int64_t t = 2; t < 2 + m; ++t) {
        EXPECT_EQ(batch.targets[t], -1) << t;
        EXPECT_EQ(batch.modality[t], 1) << t;
    }
    EXPECT_EQ(batch.targets[2 + m], s.text[0]);
    for (int64_t j = 0; j + 1 < std::ssize(s.text); ++j) EXPECT_EQ(batch.targets[3 + m + j], s.text[j + 1]) << j;
    EXPECT_EQ(batch.targets[len - 1], -1);
    for (int64_t t = 0; t < len; ++t) {
        if (t < 2 || t >= 2 + m) {
            EXPECT_EQ(batch.modality[t], 0) << t;
        }
    }
    // Every supervised target is a caption token: exactly text.size() of them (the last one is <eos>).
    EXPECT_EQ(batch.stats.supervised_tokens, std::ssize(s.text));
    EXPECT_EQ(batch.stats.image_tokens, m);
    EXPECT_EQ(batch.stats.text_tokens, 3 + std::ssize(s.text));
    EXPECT_EQ(batch.stats.pad_tokens, 0);
    EXPECT_EQ(b.cursor(), 1);
    multimodal_batch_check(batch, kIds);
}

TEST(ShapesBatcherLayout, KnownStageOneCaption) {
    ShapesBatcher b(ShapesOptions{.seed = 3, .stage = 1}, ShapesSplit::val);
    MultimodalBatch batch;
    b.next(1, ShapesBatcher::max_sample_tokens(b.dataset().options()), &batch);
    const auto& first = batch.samples.at(0);
    const std::span<const int32_t> row(batch.inputs.data(), static_cast<size_t>(first.length));
    const std::string words = shapes_decode(row);
    const ShapesScene& scene = b.dataset().sample(ShapesSplit::val, 0).scene;
    const std::string color(shapes_token_word(shapes_color_token(scene.objects.at(0).color)));
    const int64_t m = shapes_image_tokens(scene.height, scene.width);
    std::string want = "<bos> <img_start>";
    for (int64_t i = 0; i < m; ++i) want += " <img_pad>";
    want += " <img_end> there is one shape . a large " + color + " square at center . <eos>";
    EXPECT_EQ(words, want);
}

TEST(ShapesBatcherPacking, TwoSamplesShareARowAndTheRestIsPadding) {
    const ShapesOptions o{.seed = 11};
    const ShapesDataset ds(o);
    const int64_t l0 = length_of(ds, ShapesSplit::train, 0), l1 = length_of(ds, ShapesSplit::train, 1);
    const int64_t seq = l0 + l1 + 5;
    ShapesBatcher b(o, ShapesSplit::train);
    MultimodalBatch batch;
    b.next(1, seq, &batch);
    ASSERT_GE(batch.samples.size(), 2u);
    EXPECT_EQ(batch.samples[0].offset, 0);
    EXPECT_EQ(batch.samples[1].offset, l0);
    std::vector<int32_t> want = sequence_of(ds, ShapesSplit::train, 0);
    const auto s1 = sequence_of(ds, ShapesSplit::train, 1);
    want.insert(want.end(), s1.begin(), s1.end());
    // Sample 2 (at least 3 + 16 + 13 tokens) does not fit the 5 tokens left: padding.
    EXPECT_EQ(batch.samples.size(), 2u);
    want.insert(want.end(), 5, kShapesPad);
    EXPECT_EQ(batch.inputs, want);
    for (int64_t t = l0 + l1; t < seq; ++t) {
        EXPECT_EQ(batch.targets[t], -1);
        EXPECT_EQ(batch.modality[t], 0);
    }
    EXPECT_EQ(batch.stats.pad_tokens, 5);
    EXPECT_EQ(batch.targets[l0 - 1], -1) << "sample 0's <eos> does not predict sample 1's <bos>";
    EXPECT_EQ(batch.inputs[l0], kShapesBos);
    multimodal_batch_check(batch, kIds);
}

TEST(ShapesBatcherPacking, OverflowOpensTheNextRowAndTheNextBatch) {
    const ShapesOptions o{.seed = 11};
    const ShapesDataset ds(o);
    const int64_t l0 = length_of(ds, ShapesSplit::train, 0), l1 = length_of(ds, ShapesSplit::train, 1);
    const int64_t seq = std::max(l0, l1) + std::min(l0, l1) - 1;  // any one fits, no two do
    ShapesBatcher b(o, ShapesSplit::train);
    MultimodalBatch batch;
    b.next(2, seq, &batch);
    ASSERT_EQ(batch.samples.size(), 2u);
    EXPECT_EQ(batch.samples[1].row, 1);
    EXPECT_EQ(batch.samples[1].offset, 0);
    EXPECT_EQ(batch.inputs[seq], kShapesBos);
    for (int64_t t = l0; t < seq; ++t) EXPECT_EQ(batch.inputs[t], kShapesPad) << t;
    EXPECT_EQ(b.cursor(), 2);
    // One row: sample 1 does not fit after sample 0, so it is not consumed and opens the next batch.
    ShapesBatcher c(o, ShapesSplit::train);
    c.next(1, seq, &batch);
    ASSERT_EQ(batch.samples.size(), 1u);
    EXPECT_EQ(c.cursor(), 1);
    c.next(1, seq, &batch);
    ASSERT_EQ(batch.samples.size(), 1u);
    EXPECT_EQ(batch.samples[0].index, 1);
    EXPECT_EQ(std::vector<int32_t>(batch.inputs.begin(), batch.inputs.begin() + l1),
              sequence_of(ds, ShapesSplit::train, 1));
}

TEST(ShapesBatcherPacking, ResumeFromTheCursorIsBitwise) {
    const ShapesOptions o{.seed = 5};
    const int64_t seq = 300, rows = 3;
    ShapesBatcher a(o, ShapesSplit::train);
    std::vector<MultimodalBatch> run(4);
    std::vector<int64_t> cursors;
    for (auto& batch : run) {
        cursors.push_back(a.cursor());
        a.next(rows, seq, &batch);
    }
    for (size_t i = 1; i < run.size(); ++i) {
        ShapesBatcher r(o, ShapesSplit::train);
        r.set_cursor(cursors[i]);
        for (size_t j = i; j < run.size(); ++j) {
            MultimodalBatch batch;
            r.next(rows, seq, &batch);
            expect_same(batch, run[j]);
        }
    }
    // The same batcher rewound (the pending sample cache is dropped) also repeats.
    a.set_cursor(cursors[2]);
    MultimodalBatch again;
    a.next(rows, seq, &again);
    expect_same(again, run[2]);
}

TEST(ShapesBatcherPacking, RanksSeeDisjointSamples) {
    const ShapesOptions o{.seed = 5};
    const int world = 3;
    std::set<int64_t> seen;
    int64_t total = 0;
    for (int rank = 0; rank < world; ++rank) {
        ShapesBatcher b(o, ShapesSplit::train, rank, world);
        MultimodalBatch batch;
        b.next(2, 400, &batch);
        for (size_t i = 0; i < batch.samples.size(); ++i) {
            EXPECT_EQ(batch.samples[i].index, static_cast<int64_t>(i) * world + rank);
            seen.insert(batch.samples[i].index);
        }
        total += std::ssize(batch.samples);
        EXPECT_EQ(b.cursor(), std::ssize(batch.samples));
    }
    EXPECT_EQ(std::ssize(seen), total);
    expect_error([&] { ShapesBatcher(o, ShapesSplit::train, 3, 3); }, ExitCode::internal, {"rank 3 of world 3"});
}

TEST(ShapesBatcherImages, ImagesFollowTheBlocksAndPatchesMatchTheGrids) {
    const ShapesOptions o{.seed = 9};
    ShapesBatcher b(o, ShapesSplit::train);
    MultimodalBatch batch;
    b.next(4, 500, &batch);
    multimodal_batch_check(batch, kIds);
    const int64_t blocks = std::count(batch.inputs.begin(), batch.inputs.end(), kShapesImgStart);
    ASSERT_EQ(std::ssize(batch.images.grids), blocks);
    ASSERT_EQ(batch.images.grids.size(), batch.samples.size());
    EXPECT_EQ(batch.images.values_per_patch, 588);
    int64_t patches = 0;
    for (size_t i = 0; i < batch.samples.size(); ++i) {
        const ShapesScene scene = b.dataset().sample(ShapesSplit::train, batch.samples[i].index).scene;
        EXPECT_EQ(batch.images.grids[i][0], scene.height / 14) << i;
        EXPECT_EQ(batch.images.grids[i][1], scene.width / 14) << i;
        // The image's patches are exactly image_patchify of its native render.
        const ShapesImage img = shapes_render(scene);
        std::vector<float> want(static_cast<size_t>((img.height / 14) * (img.width / 14) * 588));
        image_patchify(img.rgb.data(), img.height, img.width, ImagePatchOptions{}, want.data());
        ASSERT_LE(static_cast<size_t>(patches * 588) + want.size(), batch.images.patches.size());
        EXPECT_EQ(std::memcmp(want.data(), &batch.images.patches[static_cast<size_t>(patches * 588)], want.size() * 4),
                  0)
            << "image " << i;
        patches += batch.images.grids[i][0] * batch.images.grids[i][1];
    }
    EXPECT_EQ(std::ssize(batch.images.patches), patches * 588);
    // Stats add up.
    const auto& st = batch.stats;
    EXPECT_EQ(st.image_tokens + st.text_tokens + st.pad_tokens, 4 * 500);
    EXPECT_EQ(st.image_tokens, std::count(batch.modality.begin(), batch.modality.end(), 1));
    EXPECT_EQ(st.supervised_tokens,
              std::ssize(batch.targets) - std::count(batch.targets.begin(), batch.targets.end(), -1));
    EXPECT_EQ(st.samples, std::ssize(batch.samples));
    EXPECT_EQ(st.images, std::ssize(batch.images.grids));
}

TEST(ShapesBatcherErrors, BatchCheckCatchesInconsistentImages) {
    ShapesBatcher b(ShapesOptions{.seed = 9}, ShapesSplit::train);
    MultimodalBatch batch;
    b.next(4, 200, &batch);
    multimodal_batch_check(batch, kIds);
    // Swapping two grids of different areas keeps the patch count but not the slots of block 0.
    const auto& g = batch.images.grids;
    const auto other =
        std::find_if(g.begin(), g.end(), [&](const auto& x) { return x[0] * x[1] != g[0][0] * g[0][1]; });
    ASSERT_NE(other, g.end());
    MultimodalBatch wrong_grid = batch;
    std::swap(wrong_grid.images.grids[0], wrong_grid.images.grids[static_cast<size_t>(other - g.begin())]);
    expect_error([&] { multimodal_batch_check(wrong_grid, kIds); }, ExitCode::internal, {"image block 0", "slots"});
    MultimodalBatch short_patches = batch;
    short_patches.images.patches.pop_back();
    expect_error([&] { multimodal_batch_check(short_patches, kIds); }, ExitCode::internal, {"patches hold"});
    MultimodalBatch slot_target = batch;
    slot_target.targets[2] = kShapesA;  // position 2 is an image slot of the first sample
    expect_error([&] { multimodal_batch_check(slot_target, kIds); }, ExitCode::internal, {"row 0 column 2"});
}

TEST(ShapesBatcherErrors, SampleLongerThanARowNamesItsSize) {
    const ShapesOptions o{.seed = 1};
    const ShapesDataset ds(o);
    const int64_t l0 = length_of(ds, ShapesSplit::train, 0);
    ShapesBatcher b(o, ShapesSplit::train);
    MultimodalBatch batch;
    expect_error([&] { b.next(1, l0 - 1, &batch); },
                 ExitCode::usage,
                 {"sample 0 is " + std::to_string(l0) + " tokens", "seq = " + std::to_string(l0 - 1)});
    // max_sample_tokens bounds every sample.
    const int64_t bound = ShapesBatcher::max_sample_tokens(o);
    EXPECT_EQ(bound, 3 + 144 + 6 + 21);
    for (int64_t i = 0; i < 300; ++i) EXPECT_LE(length_of(ds, ShapesSplit::train, i), bound) << i;
    ShapesOptions vqa = o;
    vqa.format = "vqa";
    EXPECT_EQ(ShapesBatcher::max_sample_tokens(vqa), 3 + 144 + 9);
    const ShapesDataset dv(vqa);
    for (int64_t i = 0; i < 50; ++i) EXPECT_LE(length_of(dv, ShapesSplit::train, i), 156) << i;
}

TEST(ShapesBatcherEval, FixedSetStopsAndRepeats) {
    ShapesOptions o{.seed = 2};
    o.val_size = 20;
    const int64_t count = 7;
    auto run = [&](ShapesBatcher& b, std::vector<MultimodalBatch>& out) {
        while (!b.exhausted()) b.next(2, 330, &out.emplace_back());
    };
    ShapesBatcher b = ShapesBatcher::fixed(o, ShapesSplit::val, count);
    std::vector<MultimodalBatch> first, second;
    run(b, first);
    std::vector<int64_t> indices;
    for (const auto& batch : first)
        for (const auto& s : batch.samples) indices.push_back(s.index);
    EXPECT_EQ(indices, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
    // Past the end: all padding, nothing supervised, no images.
    MultimodalBatch empty;
    b.next(2, 330, &empty);
    EXPECT_TRUE(empty.samples.empty());
    EXPECT_TRUE(empty.images.grids.empty());
    EXPECT_EQ(empty.stats.pad_tokens, 660);
    EXPECT_EQ(std::count(empty.targets.begin(), empty.targets.end(), -1), 660);
    // Rewound, and a fresh batcher: the same batches bitwise.
    b.set_cursor(0);
    run(b, second);
    ASSERT_EQ(second.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i) expect_same(second[i], first[i]);
    ShapesBatcher fresh = ShapesBatcher::fixed(o, ShapesSplit::val, count);
    std::vector<MultimodalBatch> third;
    run(fresh, third);
    ASSERT_EQ(third.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i) expect_same(third[i], first[i]);
    // Two ranks split the set: 0, 2, 4, 6 and 1, 3, 5.
    for (int rank = 0; rank < 2; ++rank) {
        ShapesBatcher r = ShapesBatcher::fixed(o, ShapesSplit::val, count, rank, 2);
        std::vector<MultimodalBatch> got;
        run(r, got);
        std::vector<int64_t> idx;
        for (const auto& batch : got)
            for (const auto& s : batch.samples) idx.push_back(s.index);
        EXPECT_EQ(idx, rank == 0 ? (std::vector<int64_t>{0, 2, 4, 6}) : (std::vector<int64_t>{1, 3, 5}));
    }
    expect_error([&] { ShapesBatcher::fixed(o, ShapesSplit::val, 21); }, ExitCode::internal, {"val_size is 20"});
}

TEST(ShapesBatcherEval, ValStreamWrapsOverTheFixedSet) {
    ShapesOptions o{.seed = 2};
    o.val_size = 3;
    ShapesBatcher b(o, ShapesSplit::val);
    std::vector<int64_t> idx;
    for (int64_t k = 0; k < 7; ++k) idx.push_back(b.sample_index(k));
    EXPECT_EQ(idx, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
    MultimodalBatch batch;
    b.next(4, 200, &batch);
    ASSERT_GE(batch.samples.size(), 4u);
    EXPECT_EQ(batch.samples[3].index, 0);
    const auto want = sequence_of(b.dataset(), ShapesSplit::val, 0);
    for (size_t i : {size_t{0}, size_t{3}}) {
        const auto& s = batch.samples[i];
        const auto at = batch.inputs.begin() + s.row * 200 + s.offset;
        EXPECT_EQ(std::vector<int32_t>(at, at + s.length), want) << "sample " << i;
    }
}

TEST(ShapesBatcherEval, CompValBatchesHoldAHeldOutPair) {
    ShapesOptions o{.seed = 4};
    o.val_size = 10;
    ShapesBatcher b = ShapesBatcher::fixed(o, ShapesSplit::comp_val, 4);
    MultimodalBatch batch;
    b.next(4, 200, &batch);
    ASSERT_EQ(batch.samples.size(), 4u);
    multimodal_batch_check(batch, kIds);
    for (const auto& s : batch.samples) {
        const ShapesScene scene = b.dataset().sample(ShapesSplit::comp_val, s.index).scene;
        EXPECT_TRUE(std::any_of(scene.objects.begin(), scene.objects.end(), [&](const ShapeObject& ob) {
            return !b.dataset().prior().is_allowed(ob.color, ob.kind);
        }));
    }
}

}  // namespace
}  // namespace mt::data
