// Shapes generator: vocabulary, captions and sequences, golden bytes across platforms, rendering geometry and
// resolution, horizontal flip canonicalisation, held-out splits, and option errors that name their field.
#include "data/shapes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "core/crc32c.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;

ShapeObject object(int cell, ShapeColor c, ShapeKind k, ShapeSize s, int jx = 512, int jy = 512) {
    ShapeObject o;
    o.cell = cell;
    o.color = c;
    o.kind = k;
    o.size = s;
    o.jitter_x = jx;
    o.jitter_y = jy;
    return o;
}

std::string caption_of(const ShapesScene& s) {
    return shapes_decode(shapes_caption(s));
}

uint32_t crc_of(const ShapesSample& s, const ShapesImage& img, uint32_t crc) {
    std::vector<uint8_t> bytes;
    auto put = [&](uint32_t v) {
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    put(static_cast<uint32_t>(img.height));
    put(static_cast<uint32_t>(img.width));
    for (const int32_t t : s.text) put(static_cast<uint32_t>(t));
    crc = core::crc32c(bytes.data(), bytes.size(), crc);
    return core::crc32c(img.rgb.data(), img.rgb.size(), crc);
}

TEST(Shapes, VocabularyIds) {
    const char* specials[] = {"<bos>", "<eos>", "<img_start>", "<img_pad>", "<img_end>", "<pad>"};
    for (int32_t i = 0; i < 6; ++i) EXPECT_EQ(shapes_token_word(i), specials[i]);
    for (int32_t i = 0; i < kShapesVocabSize; ++i) EXPECT_EQ(shapes_word_token(shapes_token_word(i)), i);
    EXPECT_EQ(shapes_word_token("top-left"), 37);
    EXPECT_EQ(shapes_word_token("purple"), -1);
    EXPECT_EQ(shapes_color_token(ShapeColor::orange), shapes_word_token("orange"));
    EXPECT_EQ(shapes_kind_token(ShapeKind::triangle), shapes_word_token("triangle"));
    EXPECT_EQ(shapes_size_token(ShapeSize::large), shapes_word_token("large"));
    EXPECT_EQ(shapes_cell_token(8), shapes_word_token("bottom-right"));
    const auto ids = shapes_image_token_ids();
    EXPECT_EQ(ids.img_start, 2);
    EXPECT_EQ(ids.img_pad, 3);
    EXPECT_EQ(ids.img_end, 4);
    EXPECT_EQ(ids.pad, 5);
    expect_error([] { shapes_encode("a purple circle"); }, ExitCode::internal, {"purple"});
    expect_error([] { shapes_token_word(50); }, ExitCode::internal, {"50"});
}

TEST(Shapes, CaptionAndSequence) {
    ShapesScene s;
    s.height = 112;
    s.width = 168;
    s.objects = {object(0, ShapeColor::red, ShapeKind::circle, ShapeSize::small),
                 object(8, ShapeColor::white, ShapeKind::cross, ShapeSize::large)};
    const auto caption = shapes_caption(s);
    EXPECT_EQ(shapes_decode(caption),
              "there are two shapes . a small red circle at top-left . a large white cross at bottom-right . <eos>");
    EXPECT_EQ(shapes_encode(shapes_decode(caption)), caption);
    s.objects.resize(1);
    EXPECT_EQ(caption_of(s), "there is one shape . a small red circle at top-left . <eos>");
    s.objects.clear();
    for (int c = 0; c < 9; ++c) s.objects.push_back(object(c, ShapeColor::blue, ShapeKind::square, ShapeSize::small));
    EXPECT_EQ(caption_of(s).substr(0, 25), "there are nine shapes . a");
    EXPECT_EQ(shapes_image_tokens(112, 168), 24);
    EXPECT_EQ(shapes_image_tokens(112, 112), 16);
    EXPECT_EQ(shapes_image_tokens(336, 336), 144);
    expect_error([] { shapes_image_tokens(100, 112); }, ExitCode::internal, {"multiples of 28"});
    const auto seq = shapes_sequence(caption, 24);
    ASSERT_EQ(seq.size(), 27 + caption.size());
    EXPECT_EQ(seq[0], kShapesBos);
    EXPECT_EQ(seq[1], kShapesImgStart);
    for (int i = 2; i < 26; ++i) EXPECT_EQ(seq[i], kShapesImgPad);
    EXPECT_EQ(seq[26], kShapesImgEnd);
    EXPECT_EQ(seq[27], kShapesThere);
    EXPECT_EQ(seq.back(), kShapesEos);
    s.objects = {object(4, ShapeColor::red, ShapeKind::circle, ShapeSize::small),
                 object(2, ShapeColor::red, ShapeKind::circle, ShapeSize::small)};
    expect_error([&] { shapes_caption(s); }, ExitCode::internal, {"increasing cell order"});
}

// The first samples of each split, pixels and text, hashed. A change of platform, compiler or library that moves
// one byte fails here; change the constant only with a note on why the stream changed.
TEST(Shapes, GoldenBytesAndSeeds) {
    ShapesOptions o;
    o.seed = 1234;
    const ShapesDataset ds(o);
    uint32_t crc = 0;
    std::string captions;
    for (const auto& [split, index] :
         std::vector<std::pair<ShapesSplit, uint64_t>>{{ShapesSplit::train, 0},
                                                       {ShapesSplit::train, 1},
                                                       {ShapesSplit::train, 2},
                                                       {ShapesSplit::train, uint64_t{1} << 40},
                                                       {ShapesSplit::val, 0},
                                                       {ShapesSplit::comp_val, 0}}) {
        const ShapesSample s = ds.sample(split, index);
        crc = crc_of(s, shapes_render(s.scene), crc);
        captions += shapes_decode(s.text) + "\n";
    }
    EXPECT_EQ(crc, 3832547579u) << captions;
    // A second dataset object gives the same sample; another seed a different one.
    EXPECT_EQ(ShapesDataset(o).sample(ShapesSplit::train, 2).scene, ds.sample(ShapesSplit::train, 2).scene);
    ShapesOptions other = o;
    other.seed = 1235;
    const ShapesDataset ds2(other);
    int same = 0;
    for (uint64_t i = 0; i < 20; ++i)
        same += ds2.sample(ShapesSplit::train, i).scene == ds.sample(ShapesSplit::train, i).scene;
    EXPECT_EQ(same, 0);
    // Splits are separate streams.
    EXPECT_NE(ds.sample(ShapesSplit::val, 0).scene, ds.sample(ShapesSplit::train, 0).scene);
}

TEST(Shapes, RenderGeometryAndColors) {
    ShapesScene s;
    s.height = s.width = 336;
    s.noise_key = 99;
    s.objects = {object(0, ShapeColor::red, ShapeKind::square, ShapeSize::large),
                 object(1, ShapeColor::green, ShapeKind::circle, ShapeSize::large),
                 object(2, ShapeColor::blue, ShapeKind::triangle, ShapeSize::large),
                 object(4, ShapeColor::white, ShapeKind::cross, ShapeSize::large, 0, kShapesJitterSteps),
                 object(5, ShapeColor::orange, ShapeKind::circle, ShapeSize::small, kShapesJitterSteps, 0)};
    const ShapesImage img = shapes_render(s);
    ASSERT_EQ(img.rgb.size(), 336u * 336u * 3u);
    auto px = [&](int y, int x) {
        const size_t p = (static_cast<size_t>(y) * img.width + x) * 3;
        return std::array<uint8_t, 3>{img.rgb[p], img.rgb[p + 1], img.rgb[p + 2]};
    };
    // Full-color pixels of each shape against its analytic area (edge pixels are blends).
    const double r = 0.4 * 112;
    const double areas[] = {4 * r * r, 3.14159265 * r * r, 2 * r * r, 20 * r * r / 9};  // square circle triangle cross
    for (int i = 0; i < 4; ++i) {
        const auto rgb = shapes_color_rgb(s.objects[i].color);
        int n = 0;
        for (int y = 0; y < 336; ++y)
            for (int x = 0; x < 336; ++x) n += px(y, x) == rgb;
        EXPECT_GT(n, 0.88 * areas[i]) << i;
        EXPECT_LT(n, 1.03 * areas[i]) << i;  // sample points reach 1/4 pixel past an edge
        const auto g = shapes_object_geometry(s.objects[i], 336, 336);
        EXPECT_NEAR(g.radius, r, 1e-9);
        // The box lies inside the cell.
        const int col = s.objects[i].cell % 3, row = s.objects[i].cell / 3;
        EXPECT_GE(g.center_x - g.radius, col * 112.0 - 1e-9);
        EXPECT_LE(g.center_x + g.radius, (col + 1) * 112.0 + 1e-9);
        EXPECT_GE(g.center_y - g.radius, row * 112.0 - 1e-9);
        EXPECT_LE(g.center_y + g.radius, (row + 1) * 112.0 + 1e-9);
    }
    // Jitter 0 / 1024 puts the box against the cell edge.
    const auto cross = shapes_object_geometry(s.objects[3], 336, 336);
    EXPECT_DOUBLE_EQ(cross.center_x - cross.radius, 112.0);
    EXPECT_DOUBLE_EQ(cross.center_y + cross.radius, 224.0);
    const auto dot = shapes_object_geometry(s.objects[4], 336, 336);
    EXPECT_DOUBLE_EQ(dot.center_x + dot.radius, 336.0);
    EXPECT_DOUBLE_EQ(dot.radius, 0.2 * 112);
    // The triangle points up: its rows widen downwards.
    const auto tri = shapes_object_geometry(s.objects[2], 336, 336);
    auto row_width = [&](int y) {
        int n = 0;
        for (int x = 224; x < 336; ++x) n += px(y, x) == shapes_color_rgb(ShapeColor::blue);
        return n;
    };
    EXPECT_LT(row_width(static_cast<int>(tri.center_y - r / 2)), row_width(static_cast<int>(tri.center_y + r / 2)));
    // Background: 16 +- 8 wherever no shape is near (the bottom row of cells is empty).
    for (int y = 230; y < 336; ++y)
        for (int x = 0; x < 336; ++x)
            for (const uint8_t v : px(y, x)) ASSERT_TRUE(v >= 8 && v <= 24) << y << " " << x;
}

TEST(Shapes, OneSceneAtTwoResolutions) {
    const ShapesDataset ds{ShapesOptions{}};
    for (uint64_t i = 0; i < 10; ++i) {
        const ShapesScene s = ds.sample(ShapesSplit::val, i).scene;
        const ShapesImage lo = shapes_render(s, 112, 112), hi = shapes_render(s, 336, 336);
        for (const ShapeObject& o : s.objects) {
            const auto a = shapes_object_geometry(o, 112, 112), b = shapes_object_geometry(o, 336, 336);
            EXPECT_NEAR(a.center_x * 3, b.center_x, 1e-9);
            EXPECT_NEAR(a.center_y * 3, b.center_y, 1e-9);
            EXPECT_NEAR(a.radius * 3, b.radius, 1e-9);
            // The pixel under each large object's center has its color at both sizes.
            if (o.size != ShapeSize::large) continue;
            const auto rgb = shapes_color_rgb(o.color);
            for (const auto& [img, g] : {std::pair{&lo, a}, std::pair{&hi, b}}) {
                const size_t p = (static_cast<size_t>(g.center_y) * img->width + static_cast<size_t>(g.center_x)) * 3;
                for (int c = 0; c < 3; ++c) EXPECT_EQ(img->rgb[p + c], rgb[c]) << i;
            }
        }
    }
}

TEST(ShapesFlip, HandCases) {
    ShapesScene s;
    s.objects = {object(0, ShapeColor::red, ShapeKind::circle, ShapeSize::small, 100, 7),
                 object(4, ShapeColor::cyan, ShapeKind::square, ShapeSize::large, 512, 9),
                 object(5, ShapeColor::white, ShapeKind::triangle, ShapeSize::large, 1024, 11)};
    const ShapesScene f = shapes_flip_scene(s);
    EXPECT_EQ(caption_of(f),
              "there are three shapes . a small red circle at top-right . a large white triangle at left . "
              "a large cyan square at center . <eos>");
    ASSERT_EQ(f.objects.size(), 3u);
    EXPECT_EQ(f.objects[0].jitter_x, 924);
    EXPECT_EQ(f.objects[0].jitter_y, 7);
    EXPECT_EQ(f.objects[1].jitter_x, 0);
    EXPECT_EQ(f.objects[2].jitter_x, 512);
    EXPECT_TRUE(f.noise_mirrored);
    // Middle column cells stay; a row's left and right objects swap places in the caption.
    s.objects = {object(1, ShapeColor::red, ShapeKind::circle, ShapeSize::small),
                 object(6, ShapeColor::green, ShapeKind::cross, ShapeSize::small),
                 object(7, ShapeColor::blue, ShapeKind::square, ShapeSize::small),
                 object(8, ShapeColor::yellow, ShapeKind::circle, ShapeSize::large)};
    EXPECT_EQ(caption_of(shapes_flip_scene(s)),
              "there are four shapes . a small red circle at top . a large yellow circle at bottom-left . "
              "a small blue square at bottom . a small green cross at bottom-right . <eos>");
}

TEST(ShapesFlip, InvolutionAndImages) {
    const ShapesDataset ds{ShapesOptions{}};
    for (uint64_t i = 0; i < 300; ++i) {
        const ShapesScene s = ds.sample(ShapesSplit::train, i).scene;
        const ShapesScene f = shapes_flip_scene(s);
        ASSERT_EQ(shapes_flip_scene(f), s) << i;
        // Same attributes, mirrored cells.
        std::multiset<std::tuple<int, int, int, int>> a, b;
        for (const auto& o : s.objects)
            a.insert({o.cell / 3 * 3 + 2 - o.cell % 3, int(o.color), int(o.kind), int(o.size)});
        for (const auto& o : f.objects) b.insert({o.cell, int(o.color), int(o.kind), int(o.size)});
        EXPECT_EQ(a, b) << i;
        if (i >= 12) continue;
        // The mirrored image is exactly the render of the mirrored scene, noise included, at any size.
        EXPECT_EQ(shapes_flip_image(shapes_render(s)).rgb, shapes_render(f).rgb) << i;
        EXPECT_EQ(shapes_flip_image(shapes_render(s, 112, 280)).rgb, shapes_render(f, 112, 280).rgb) << i;
        EXPECT_NE(shapes_render(s).rgb, shapes_render(f).rgb) << i;
    }
    // Boxes pressed against a shared cell edge from both sides.
    ShapesScene s;
    s.height = 168;
    s.width = 224;
    s.objects = {object(3, ShapeColor::red, ShapeKind::square, ShapeSize::large, kShapesJitterSteps, 0),
                 object(4, ShapeColor::blue, ShapeKind::cross, ShapeSize::large, 0, 0)};
    EXPECT_EQ(shapes_flip_image(shapes_render(s)).rgb, shapes_render(shapes_flip_scene(s)).rgb);
}

TEST(Shapes, HeldOutPairsOnlyInCompVal) {
    const ShapesDataset ds{ShapesOptions{}};
    const auto& prior = ds.prior();
    EXPECT_EQ(prior.pairs(), 30);
    EXPECT_FALSE(prior.is_allowed(ShapeColor::green, ShapeKind::triangle));
    EXPECT_FALSE(prior.is_allowed(ShapeColor::cyan, ShapeKind::cross));
    std::set<std::pair<int, int>> seen;
    auto scan = [&](ShapesSplit split, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i)
            for (const ShapeObject& o : ds.sample(split, i).scene.objects) {
                ASSERT_TRUE(prior.is_allowed(o.color, o.kind)) << i;
                seen.insert({int(o.color), int(o.kind)});
            }
    };
    scan(ShapesSplit::train, 3000);
    scan(ShapesSplit::val, 2000);
    EXPECT_EQ(seen.size(), 30u);
    std::set<std::pair<int, int>> held;
    for (uint64_t i = 0; i < 2000; ++i) {
        const ShapesSample s = ds.sample(ShapesSplit::comp_val, i);
        int n = 0;
        for (const ShapeObject& o : s.scene.objects)
            if (!prior.is_allowed(o.color, o.kind)) {
                ++n;
                held.insert({int(o.color), int(o.kind)});
            }
        ASSERT_GE(n, 1) << i;
        // Under the training prior a held-out pair has probability 0.
        EXPECT_EQ(*std::min_element(s.blind_logprob.begin(), s.blind_logprob.end()), -INFINITY);
    }
    EXPECT_EQ(held.size(), 2u);
}

TEST(ShapesOptions, BadOptionsNameTheirField) {
    auto bad = [](auto edit, std::initializer_list<std::string> needles) {
        ShapesOptions o;
        edit(o);
        expect_error([&] { ShapesDataset ds(o); }, ExitCode::internal, needles);
    };
    bad([](ShapesOptions& o) { o.max_objects = 0; }, {"data.shapes.max_objects", "got 0"});
    bad([](ShapesOptions& o) { o.max_objects = 10; }, {"data.shapes.max_objects"});
    bad([](ShapesOptions& o) { o.held_out = {{"purple", "circle"}}; }, {"data.shapes.held_out[0]", "color", "purple"});
    bad([](ShapesOptions& o) { o.held_out.push_back({"red", "hexagon"}); }, {"data.shapes.held_out[2]", "hexagon"});
    bad([](ShapesOptions& o) { o.held_out.push_back({"green", "triangle"}); }, {"data.shapes.held_out[2]", "twice"});
    bad([](ShapesOptions& o) { o.stage = 5; }, {"data.shapes.stage"});
    bad([](ShapesOptions& o) { o.format = "interleaved"; }, {"data.shapes.format", "interleaved"});
    bad([](ShapesOptions& o) { o.val_size = 0; }, {"data.shapes.val_size"});
    bad(
        [](ShapesOptions& o) {
            o.stage = 1;
            o.held_out.clear();
            for (const char* c : {"red", "green", "blue", "yellow", "magenta", "cyan", "white", "orange"})
                o.held_out.push_back({c, "square"});
        },
        {"data.shapes.held_out", "stage 1"});
    ShapesOptions small;
    small.val_size = 5;
    const ShapesDataset ds(small);
    expect_error([&] { ds.sample(ShapesSplit::val, 5); }, ExitCode::internal, {"data.shapes.val_size"});
    ShapesOptions none;
    none.held_out.clear();
    expect_error(
        [&] { ShapesDataset(none).sample(ShapesSplit::comp_val, 0); }, ExitCode::internal, {"data.shapes.held_out"});
}

}  // namespace
}  // namespace mt::data
