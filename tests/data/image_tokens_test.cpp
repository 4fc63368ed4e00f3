// Image-token loss mask and modality (multimodal.md §3 and §9 item 2): every position type of a shapes sequence,
// several images in one sequence, a row cut inside an image, padding, and malformed image blocks.
#include "data/image_tokens.h"

#include <gtest/gtest.h>

#include <vector>

#include "data/shapes.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;

const ImageTokenIds kIds = shapes_image_token_ids();

TEST(ShapesMask, EveryPositionTypeOfACaptionSequence) {
    const auto caption = shapes_encode("there is one shape . a large red square at center . <eos>");
    const auto seq = shapes_sequence(caption, 3);
    // <bos> <img_start> pad pad pad <img_end> there is ... . <eos>
    ASSERT_EQ(seq.size(), 6 + caption.size());
    EXPECT_EQ(seq[0], kShapesBos);
    EXPECT_EQ(seq[1], kShapesImgStart);
    EXPECT_EQ(seq[5], kShapesImgEnd);
    const auto m = image_tokens_sequence_masks(seq, kIds);
    ASSERT_EQ(m.loss_mask.size(), seq.size() - 1);
    EXPECT_EQ(m.loss_mask[0], 0) << "<bos> predicts <img_start>: not a text target";
    EXPECT_EQ(m.loss_mask[1], 0) << "<img_start> is never supervised";
    for (int t = 2; t <= 4; ++t) {
        EXPECT_EQ(m.loss_mask[t], 0) << "image slot " << t;
        EXPECT_EQ(m.modality[t], 1) << "image slot " << t;
    }
    EXPECT_EQ(m.loss_mask[5], 1) << "<img_end> predicts the first caption token";
    for (size_t t = 6; t < m.loss_mask.size(); ++t) EXPECT_EQ(m.loss_mask[t], 1) << "caption position " << t;
    EXPECT_EQ(seq.back(), kShapesEos);  // the last position's target is <eos>, supervised above
    for (size_t t = 0; t < m.modality.size(); ++t) {
        if (t < 2 || t > 4) {
            EXPECT_EQ(m.modality[t], 0) << t;
        }
    }
}

TEST(ShapesMask, SeveralImagesAndAnEmptyBlock) {
    // <bos> what <img_start> p p <img_end> color <img_start> <img_end> is <img_start> p <img_end> ? <eos>
    const int32_t s = kShapesImgStart, p = kShapesImgPad, e = kShapesImgEnd;
    const std::vector<int32_t> seq = {
        kShapesBos, kShapesWhat, s, p, p, e, kShapesColor, s, e, kShapesIs, s, p, e, kShapesQuestion, kShapesEos};
    const std::vector<uint8_t> want_loss = {1, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 1};
    const std::vector<uint8_t> want_modality = {0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    const auto m = image_tokens_sequence_masks(seq, kIds);
    EXPECT_EQ(m.loss_mask, want_loss);
    EXPECT_EQ(m.modality, want_modality);
}

TEST(ShapesMask, RowCutInsideAnImageAndPadding) {
    // A packed row that starts inside an image and ends in padding: inputs p p <img_end> a . <eos> <pad>.
    const std::vector<int32_t> in = {kShapesImgPad, kShapesImgPad, kShapesImgEnd, kShapesA, kShapesDot, kShapesEos, 5};
    const std::vector<int32_t> tg = {kShapesImgPad, kShapesImgEnd, kShapesA, kShapesDot, kShapesEos, 5, 5};
    std::vector<uint8_t> loss(in.size()), modality(in.size());
    image_tokens_masks(in, tg, kIds, loss, modality);
    EXPECT_EQ(loss, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0, 0}));
    EXPECT_EQ(modality, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0}));
    // Without a pad id, a pad target counts as text.
    ImageTokenIds no_pad = kIds;
    no_pad.pad = -1;
    image_tokens_masks(in, tg, no_pad, loss, modality);
    EXPECT_EQ(loss[5], 1);
}

TEST(ShapesMask, MalformedBlocksAreRejected) {
    const int32_t s = kShapesImgStart, p = kShapesImgPad, e = kShapesImgEnd, a = kShapesA;
    const std::vector<std::pair<std::vector<int32_t>, std::string>> bad = {
        {{kShapesBos, p, a}, "<img_pad> outside an image block"},
        {{kShapesBos, s, p, a}, "text token inside an image block"},
        {{kShapesBos, s, s, e}, "inside another image block"},
        {{kShapesBos, e, a}, "without an open image block"},
        {{kShapesBos, s, p}, "not closed"},
    };
    for (const auto& [seq, needle] : bad)
        expect_error([&] { image_tokens_sequence_masks(seq, kIds); }, ExitCode::internal, {needle});
    std::vector<uint8_t> loss(2), modality(1);
    const std::vector<int32_t> two = {a, a};
    expect_error([&] { image_tokens_masks(two, two, kIds, loss, modality); }, ExitCode::internal, {"one length"});
}

}  // namespace
}  // namespace mt::data
