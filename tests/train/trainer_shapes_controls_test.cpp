// The shapes controls in the trainer (multimodal.md §6, docs/multimodal.md): every control of data.shapes.controls
// runs at each eval with its own loss, bound and greedy scores; a view that changes nothing scores bitwise like the
// plain val set; and the teacher-forced exact match is exactly free-running greedy decoding, checked by decoding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "data/shapes_vocab.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::fresh_dir;

// Stage 2 (color and shape: comp-val can draw the held-out pairs) on 112x112 canvases, a tiny ViT and LM.
JobConfig controls_job(const std::string& dir, std::vector<std::string> overrides = {}) {
    std::vector<std::string> o = {"run.dir=\"" + dir + "\"",
                                  "run.device=\"cpu\"",
                                  "run.threads=2",
                                  "train.batch_size=2",
                                  "train.seq_len=176",
                                  "model.max_seq_len=176",
                                  "train.eval_batches=2",
                                  "checkpoint.every_steps=0",
                                  "data.shapes.stage=2",
                                  "data.shapes.max_canvas=112",
                                  "data.shapes.controls=[\"zeroed\",\"shuffled\",\"flipped\",\"res112\",\"res336\","
                                  "\"comp_val\"]"};
    const std::vector<std::string> vision = mt::testing::tiny_vision_overrides();
    o.insert(o.end(), vision.begin(), vision.end());
    o.insert(o.end(), overrides.begin(), overrides.end());
    return config_load(std::string(MT_SOURCE_DIR) + "/configs/shapes_tiny.toml", o);
}

TEST(TrainerShapesControls, EveryControlRunsAndANeutralViewMatchesThePlainSet) {
    Trainer trainer(controls_job(fresh_dir("controls")), false);
    for (int s = 0; s < 3; ++s) trainer.train_step();
    const double val = trainer.evaluate();
    const ShapesEval& plain = trainer.last_shapes_eval();
    EXPECT_EQ(plain.loss, val);
    EXPECT_GT(plain.bound, 0.0);
    EXPECT_GT(plain.score.samples, 0);
    const auto controls = trainer.last_shapes_controls();
    ASSERT_EQ(controls.size(), 6u);
    for (const auto& [control, e] : controls) {
        SCOPED_TRACE(nn::enum_name(control));
        EXPECT_TRUE(std::isfinite(e.loss));
        EXPECT_GT(e.score.samples, 0);
        EXPECT_GE(e.score.exact_match(), 0.0);
        EXPECT_LE(e.score.exact_match(), 1.0);
        switch (control) {
            case ShapesControl::res112:
                // Every canvas is already 112x112: the view is the plain one, bit for bit.
                EXPECT_EQ(e.loss, plain.loss);
                EXPECT_EQ(e.bound, plain.bound);
                EXPECT_EQ(e.score.exact, plain.score.exact);
                break;
            case ShapesControl::zeroed:
            case ShapesControl::shuffled:
            case ShapesControl::res336:
                // Same captions, other pixels: the bound is the plain set's, the loss is not.
                EXPECT_EQ(e.bound, plain.bound);
                EXPECT_NE(e.loss, plain.loss);
                break;
            case ShapesControl::flipped:
                // Stage 2 puts the object at the center: the mirrored caption is the caption.
                EXPECT_EQ(e.bound, plain.bound);
                break;
            case ShapesControl::comp_val: {
                // Held-out pairs have blind probability 0: accuracy only.
                EXPECT_TRUE(std::isinf(e.bound));
                const data::ShapesScore& sc = e.score;
                EXPECT_GT(sc.attribute_tokens[static_cast<size_t>(data::ShapesAttribute::color)], 0);
                EXPECT_GT(sc.attribute_tokens[static_cast<size_t>(data::ShapesAttribute::shape)], 0);
                break;
            }
        }
    }
}

// Free-running greedy decoding of every val sample of a batch, against the teacher-forced exact match: from the
// first caption token on, each caption input is replaced by the argmax at the position before it (all samples of
// the batch at once; a row's samples are separate documents). The sample's last input, its <eos>, is kept so the
// documents stay apart; the argmax before it is compared instead. After the model has learnt the template some
// samples are exact and some not, and the two answers must agree on every one.
TEST(TrainerShapesControls, TeacherForcedExactMatchIsGreedyDecoding) {
    // Stage 1 (the color the only unknown): once the template is learnt, about one sample in 8 is exact by chance.
    const std::vector<std::string> stage1 = {"train.lr=1e-2", "train.warmup_steps=2", "data.shapes.stage=1"};
    Trainer trainer(controls_job(fresh_dir("greedy"), stage1), false);
    for (int s = 0; s < 40; ++s) trainer.train_step();
    const JobConfig cfg = controls_job(fresh_dir("greedy_src"), stage1);
    ImageTextSource source(shapes_options_of(cfg), data::ShapesSplit::val, cfg.train.seq_len, 14);
    const int64_t rows = 8, seq = cfg.train.seq_len;
    const core::Tensor inputs = core::Tensor::zeros({rows, seq}, core::DType::i32), targets = inputs.clone();
    nn::VisionBatch images;
    source.fill(0, rows, inputs, targets, &images);
    nn::Model& model = trainer.model();
    model.set_track_predictions(true);
    auto forward = [&](const core::Tensor& in) {
        model.set_vision_batch(images);
        model.forward(in, targets, /*training=*/false);
        return model.last_predictions().clone();
    };
    const core::Tensor teacher = forward(inputs);
    data::ShapesScore forced;
    data::shapes_score_samples({targets.data<int32_t>(), static_cast<size_t>(targets.numel())},
                               {teacher.data<int32_t>(), static_cast<size_t>(teacher.numel())},
                               seq,
                               source.last_samples(),
                               &forced);
    // Greedy: the caption of a one-object sample is 13 tokens, <eos> last; its first caption token follows <img_end>.
    const core::Tensor greedy_in = inputs.clone();
    int32_t* g = greedy_in.data<int32_t>();
    const int32_t* t = targets.data<int32_t>();
    std::vector<int32_t> last_pred(source.last_samples().size(), -1);
    for (int step = 0; step < 13; ++step) {
        const core::Tensor pred = forward(greedy_in);
        for (size_t i = 0; i < source.last_samples().size(); ++i) {
            const data::MultimodalBatchSample& s = source.last_samples()[i];
            const int64_t end = s.row * seq + s.offset + s.length;  // one past the sample's <eos>
            int64_t first = end - 14;                               // the position whose input is <img_end>
            ASSERT_EQ(g[first], data::kShapesImgEnd) << "sample " << s.index;
            const int64_t p = first + step;  // predicts caption token `step`
            ASSERT_GE(t[p], 0);
            if (p + 1 < end - 1)
                g[p + 1] = pred.data<int32_t>()[p];
            else
                last_pred[i] = pred.data<int32_t>()[p];
        }
    }
    int64_t exact = 0;
    for (size_t i = 0; i < source.last_samples().size(); ++i) {
        const data::MultimodalBatchSample& s = source.last_samples()[i];
        const int64_t end = s.row * seq + s.offset + s.length;
        bool same = last_pred[i] == data::kShapesEos;
        for (int64_t p = end - 13; p < end - 1; ++p) same = same && g[p] == inputs.data<int32_t>()[p];
        exact += same ? 1 : 0;
    }
    EXPECT_EQ(exact, forced.exact);
    // Both answers occur, so the agreement compared something.
    EXPECT_GT(forced.exact, 0);
    EXPECT_LT(forced.exact, forced.samples);
    std::printf("greedy check: %lld of %lld samples exact\n",
                static_cast<long long>(forced.exact),
                static_cast<long long>(forced.samples));
    model.set_track_predictions(false);
}

}  // namespace
}  // namespace mt::train
