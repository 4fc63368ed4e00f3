// The shapes image-blind bound (multimodal.md §6, §9 item 3): the closed form against full enumeration of every scene
// with K <= 3 (A = 30 and 32), the table values, per-token log-probs of every val sample, the debug-ladder stages and
// the VQA format.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include "core/error.h"
#include "data/shapes.h"

namespace mt::data {
namespace {

// Neumaier-compensated sum: millions of terms to 1e-15.
struct Sum {
    double s = 0, c = 0;
    void add(double x) {
        const double t = s + x;
        c += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
        s = t;
    }
    double value() const {
        return s + c;
    }
};

double total(const std::vector<double>& v) {
    double s = 0;
    for (const double x : v) s += x;
    return s;
}

ShapesOptions nothing_held_out() {
    ShapesOptions o;
    o.held_out.clear();
    return o;
}

// Every allowed (size, color, shape) of one object.
std::vector<ShapeObject> object_attributes(const ShapesPrior& prior) {
    std::vector<ShapeObject> out;
    for (int s = 0; s < 2; ++s)
        for (int c = 0; c < kShapeColors; ++c)
            for (int k = 0; k < kShapeKinds; ++k) {
                ShapeObject o;
                o.size = static_cast<ShapeSize>(s);
                o.color = static_cast<ShapeColor>(c);
                o.kind = static_cast<ShapeKind>(k);
                if (prior.is_allowed(o.color, o.kind)) out.push_back(o);
            }
    return out;
}

TEST(ShapesBound, ClosedFormTable) {
    const ShapesPrior a32 = shapes_make_prior(nothing_held_out()), a30 = shapes_make_prior(ShapesOptions{});
    ASSERT_EQ(a32.pairs(), 32);
    ASSERT_EQ(a30.pairs(), 30);
    EXPECT_NEAR(shapes_bound_caption(a32, 1), 7.4547, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a32, 2), 12.9999, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a32, 3), 18.0061, 1e-4);
    EXPECT_NEAR(shapes_bound_expected(a32), 12.8202, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a30, 1), 7.3902, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a30, 2), 12.8708, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a30, 3), 17.8125, 1e-4);
    EXPECT_NEAR(shapes_bound_expected(a30), 12.6912, 1e-4);
    EXPECT_NEAR(shapes_bound_caption(a32, 2), std::log(3.0) + std::log(36.0) + 2 * std::log(64.0), 1e-12);
}

// Every scene with K <= 3 objects: the caption's summed token log-probs equal the closed form, the probabilities sum
// to 1, and their expected -ln P equals shapes_bound_expected. K <= 2 runs each whole caption through
// shapes_blind_logprobs; K = 3 (22M scenes) adds the token log-probs of its cell list (from the caption of that cell
// set) and of each object's size, color and shape tokens (from a one-object caption), which K <= 2 shows is the same.
TEST(ShapesBound, EnumerationMatchesClosedForm) {
    for (const ShapesOptions& options : {nothing_held_out(), ShapesOptions{}}) {
        const ShapesPrior prior = shapes_make_prior(options);
        const auto attrs = object_attributes(prior);
        const int n = static_cast<int>(attrs.size());
        ASSERT_EQ(n, 2 * prior.pairs());
        Sum mass, expected;
        double worst = 0;
        int64_t scenes = 0;
        auto visit = [&](int k, double lp) {
            worst = std::max(worst, std::fabs(-lp - shapes_bound_caption(prior, k)));
            const double p = std::exp(lp);
            mass.add(p);
            expected.add(-p * lp);
            ++scenes;
        };
        // ln P of each object's size, color and shape tokens, read from one-object captions.
        std::vector<double> attr_lp;
        for (const ShapeObject& a : attrs) {
            ShapesScene one;
            one.objects = {a};
            const auto lp = shapes_blind_logprobs(prior, shapes_caption(one));
            attr_lp.push_back(lp[6] + lp[7] + lp[8]);
        }
        for (int mask = 1; mask < (1 << kShapeCells); ++mask) {
            const int k = std::popcount(static_cast<unsigned>(mask));
            if (k > 3) continue;
            ShapesScene s;
            for (int c = 0; c < kShapeCells; ++c) {
                if ((mask >> c & 1) == 0) continue;
                s.objects.push_back(attrs[0]);
                s.objects.back().cell = c;
            }
            if (k == 3) {
                const double cells_lp = total(shapes_blind_logprobs(prior, shapes_caption(s))) - 3 * attr_lp[0];
                for (int a = 0; a < n; ++a)
                    for (int b = 0; b < n; ++b)
                        for (int c = 0; c < n; ++c) visit(3, cells_lp + attr_lp[a] + attr_lp[b] + attr_lp[c]);
                continue;
            }
            for (int t = 0; t < (k == 1 ? n : n * n); ++t) {
                for (int i = 0; i < k; ++i) {
                    const int cell = s.objects[i].cell;
                    s.objects[i] = attrs[i == 0 ? t % n : t / n];
                    s.objects[i].cell = cell;
                }
                visit(k, total(shapes_blind_logprobs(prior, shapes_caption(s))));
            }
        }
        const int64_t a2 = 2 * prior.pairs();
        EXPECT_EQ(scenes, 9 * a2 + 36 * a2 * a2 + 84 * a2 * a2 * a2);
        EXPECT_LT(worst, 1e-12) << "A = " << prior.pairs();
        EXPECT_NEAR(mass.value(), 1.0, 1e-12) << "A = " << prior.pairs();
        EXPECT_NEAR(expected.value(), shapes_bound_expected(prior), 1e-12) << "A = " << prior.pairs();
    }
}

TEST(ShapesBound, PerTokenValues) {
    const ShapesPrior prior = shapes_make_prior(ShapesOptions{});
    const auto text =
        shapes_encode("there are two shapes . a small red circle at top-left . a large cyan square at right . <eos>");
    const auto lp = shapes_blind_logprobs(prior, text);
    ASSERT_EQ(lp.size(), text.size());
    std::vector<double> want(text.size(), 0.0);
    want[1] = std::log(2.0 / 3);    // are
    want[2] = std::log(0.5);        // two
    want[6] = std::log(0.5);        // small
    want[7] = std::log(4.0 / 30);   // red: 4 shapes allowed
    want[8] = std::log(1.0 / 4);    // circle
    want[10] = std::log(8.0 / 36);  // top-left: C(8,1) / C(9,2)
    want[13] = std::log(0.5);       // large
    want[14] = std::log(3.0 / 30);  // cyan: cross held out
    want[15] = std::log(1.0 / 3);   // square
    want[17] = std::log(1.0 / 8);   // right after top-left: C(3,0) / C(8,1)
    for (size_t i = 0; i < text.size(); ++i) EXPECT_NEAR(lp[i], want[i], 1e-15) << shapes_token_word(text[i]);
    // A held-out pair, a wrong cell order and a count above max_objects have probability 0; bad grammar is an error.
    EXPECT_EQ(
        shapes_blind_logprobs(prior, shapes_encode("there is one shape . a small green triangle at top . <eos>"))[8],
        -INFINITY);
    EXPECT_EQ(
        shapes_blind_logprobs(
            prior,
            shapes_encode("there are two shapes . a small red circle at top . a small red circle at top . <eos>"))[17],
        -INFINITY);
    EXPECT_EQ(shapes_blind_logprobs(prior,
                                    shapes_encode("there are four shapes . a small red circle at top . "
                                                  "a small red circle at left . a small red circle at center "
                                                  ". a small red circle at right . <eos>"))[2],
              -INFINITY);
    EXPECT_THROW(shapes_blind_logprobs(prior, shapes_encode("there is one shape . a red small circle")), core::Error);
    EXPECT_THROW(shapes_blind_logprobs(prior, shapes_encode("there is one shape . <eos> <eos>")), core::Error);
}

TEST(ShapesBound, EveryValSampleSumsToItsClosedForm) {
    const ShapesDataset ds{ShapesOptions{}};
    ASSERT_EQ(ds.options().val_size, 2000);
    double sum = 0;
    std::set<size_t> ks;
    for (uint64_t i = 0; i < 2000; ++i) {
        const ShapesSample s = ds.sample(ShapesSplit::val, i);
        ASSERT_EQ(s.blind_logprob.size(), s.text.size());
        const double nll = -total(s.blind_logprob);
        ASSERT_NEAR(nll, shapes_bound_caption(ds.prior(), static_cast<int>(s.scene.objects.size())), 1e-12) << i;
        sum += nll;
        ks.insert(s.scene.objects.size());
    }
    EXPECT_EQ(ks.size(), 3u);
    EXPECT_NEAR(ds.val_bound(), sum / 2000, 1e-12);
    EXPECT_NEAR(ds.val_bound(), 12.6912, 0.4);  // the expectation, within 4 standard errors
}

TEST(ShapesStages, BoundsAndWhatVaries) {
    for (int stage = 1; stage <= 3; ++stage) {
        ShapesOptions o;
        o.stage = stage;
        o.val_size = 1500;
        const ShapesDataset ds(o);
        const double want = stage == 1 ? std::log(8.0) : std::log(30.0) + (stage == 3 ? std::log(9.0) : 0.0);
        EXPECT_NEAR(shapes_bound_expected(ds.prior()), want, 1e-12) << stage;
        std::set<int> colors, pairs, cells, heights;
        for (uint64_t i = 0; i < 1500; ++i) {
            const ShapesSample s = ds.sample(ShapesSplit::val, i);
            ASSERT_EQ(s.scene.objects.size(), 1u);
            const ShapeObject& obj = s.scene.objects[0];
            EXPECT_EQ(obj.size, ShapeSize::large);
            if (stage <= 2) {
                EXPECT_EQ(obj.cell, 4);
            }
            if (stage == 1) {
                EXPECT_EQ(obj.kind, ShapeKind::square);
            }
            colors.insert(int(obj.color));
            pairs.insert(int(obj.color) * 4 + int(obj.kind));
            cells.insert(obj.cell);
            heights.insert(s.scene.height);
            EXPECT_EQ(shapes_decode(std::span(s.text).first(5)), "there is one shape .");
            ASSERT_NEAR(-total(s.blind_logprob), want, 1e-12) << stage << " " << i;
        }
        EXPECT_EQ(colors.size(), 8u);
        EXPECT_EQ(pairs.size(), stage == 1 ? 8u : 30u);
        EXPECT_EQ(cells.size(), stage == 3 ? 9u : 1u);
        EXPECT_EQ(heights.size(), 5u);
        EXPECT_NEAR(ds.val_bound(), want, 1e-12);
    }
    // Stage 1 draws only the colors allowed with square.
    ShapesOptions o;
    o.stage = 1;
    o.held_out = {{"red", "square"}};
    const ShapesDataset ds(o);
    EXPECT_NEAR(shapes_bound_expected(ds.prior()), std::log(7.0), 1e-12);
    for (uint64_t i = 0; i < 200; ++i)
        EXPECT_NE(ds.sample(ShapesSplit::train, i).scene.objects[0].color, ShapeColor::red);
    EXPECT_EQ(ds.sample(ShapesSplit::comp_val, 0).scene.objects[0].color, ShapeColor::red);
    // Stage 4 with up to 9 objects.
    ShapesOptions nine;
    nine.max_objects = 9;
    nine.val_size = 400;
    const ShapesDataset ds9(nine);
    std::set<size_t> ks;
    for (uint64_t i = 0; i < 400; ++i) {
        const ShapesSample s = ds9.sample(ShapesSplit::val, i);
        ks.insert(s.scene.objects.size());
        const int k = static_cast<int>(s.scene.objects.size());
        ASSERT_NEAR(-total(s.blind_logprob),
                    std::log(9.0) + std::log(std::tgamma(10.0) / std::tgamma(k + 1.0) / std::tgamma(10.0 - k)) +
                        k * std::log(60.0),
                    1e-10);
    }
    EXPECT_EQ(ks.size(), 9u);
}

TEST(ShapesVqa, QuestionsAnswersAndBound) {
    ShapesOptions o;
    o.format = "vqa";
    o.val_size = 500;
    const ShapesDataset ds(o);
    const ShapesPrior& prior = ds.prior();
    EXPECT_NEAR(
        prior.vqa_kind_prob[0] + prior.vqa_kind_prob[1] + prior.vqa_kind_prob[2] + prior.vqa_kind_prob[3], 1.0, 1e-12);
    for (uint64_t i = 0; i < 500; ++i) {
        const ShapesSample s = ds.sample(ShapesSplit::val, i);
        ASSERT_EQ(s.text.size(), 9u);
        EXPECT_EQ(s.prompt_len, 6);
        EXPECT_EQ(shapes_decode(std::span(s.text).first(4)), "what color is the");
        const auto kind = static_cast<ShapeKind>(s.text[4] - kShapesKindFirst);
        int count = 0;
        for (const ShapeObject& obj : s.scene.objects)
            if (obj.kind == kind) {
                ++count;
                EXPECT_EQ(s.text[6], shapes_color_token(obj.color)) << i;
            }
        EXPECT_EQ(count, 1) << i;
        const double want = std::log(prior.vqa_kind_prob[int(kind)]) - std::log(prior.colors_of(kind));
        ASSERT_NEAR(total(s.blind_logprob), want, 1e-12) << i;
    }
    // The question's shape follows vqa_kind_prob.
    std::array<int, 4> asked{};
    const int n = 4000;
    for (uint64_t i = 0; i < n; ++i) ++asked[ds.sample(ShapesSplit::train, i).text[4] - kShapesKindFirst];
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(asked[k] / double(n), prior.vqa_kind_prob[k], 0.03) << k;
    // comp-val asks about a held-out object.
    for (uint64_t i = 0; i < 100; ++i) {
        const ShapesSample s = ds.sample(ShapesSplit::comp_val, i);
        EXPECT_FALSE(prior.is_allowed(static_cast<ShapeColor>(s.text[6] - kShapesColorFirst),
                                      static_cast<ShapeKind>(s.text[4] - kShapesKindFirst)))
            << i;
    }
    EXPECT_GT(ds.val_bound(), 0.0);
    EXPECT_TRUE(std::isfinite(ds.val_bound()));
}

}  // namespace
}  // namespace mt::data
