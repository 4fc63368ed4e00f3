// Loss scaling: the dynamic scaler's skip / back-off / growth rules and their checkpoint state; a fixed power-of-two
// scale changes nothing (bit-identical f32 training); precision choices that cannot run are refused.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::optim::LossScaler;
using mt::optim::LossScalerConfig;

TEST(LossScaler, FixedScaleNeverMoves) {
    LossScaler s({.dynamic = false, .scale = 8.0});
    EXPECT_TRUE(s.update(true));
    EXPECT_FALSE(s.update(false));  // the trainer treats this as fatal
    EXPECT_EQ(s.scale(), 8.0);
    EXPECT_EQ(s.skipped(), 0);
}

TEST(LossScaler, DynamicSkipsBacksOffWithHysteresisAndGrows) {
    LossScaler s({.dynamic = true, .scale = 1024.0, .growth_interval = 3, .hysteresis = 2, .min_scale = 256.0});
    EXPECT_FALSE(s.update(false));  // first overflow: skipped, hysteresis absorbs it
    EXPECT_EQ(s.scale(), 1024.0);
    EXPECT_FALSE(s.update(false));  // second: back off
    EXPECT_EQ(s.scale(), 512.0);
    EXPECT_EQ(s.skipped(), 2);
    EXPECT_TRUE(s.update(true));
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(s.scale(), 512.0);
    EXPECT_TRUE(s.update(true));  // third clean step in a row: grow
    EXPECT_EQ(s.scale(), 1024.0);
    // Down to the floor, where an overflow has nothing left to back off to.
    for (int i = 0; i < 6; ++i) s.update(false);
    EXPECT_EQ(s.scale(), 256.0);
    EXPECT_TRUE(s.exhausted());
    EXPECT_TRUE(s.update(true));
    EXPECT_FALSE(s.exhausted());
}

TEST(LossScaler, StateRoundTripsAndIgnoresAFixedScalersState) {
    const LossScalerConfig cfg{.dynamic = true, .scale = 1024.0, .growth_interval = 5, .hysteresis = 2};
    LossScaler a(cfg);
    a.update(false);
    a.update(false);
    a.update(true);
    LossScaler b(cfg);
    b.load_state(a.state());
    EXPECT_EQ(b.state(), a.state());
    for (bool f : {true, true, true, false, true}) EXPECT_EQ(a.update(f), b.update(f));
    EXPECT_EQ(a.scale(), b.scale());
    LossScaler c(cfg);
    c.load_state(LossScaler({.scale = 1.0}).state());  // resumed from a bf16 run: keep the fresh dynamic state
    EXPECT_EQ(c.scale(), 1024.0);
}

TEST(LossScaler, PowerOfTwoScaleGivesBitIdenticalF32Training) {
    // Scaling the loss gradient by 2^k and dividing it out again is exact in binary floating point (barring
    // overflow), so the curve must not move by one bit: proof that the scale reaches every gradient and is divided
    // out exactly once.
    const std::string dir = mt::testing::fresh_dir("scale");
    mt::train::Trainer plain(mt::testing::tiny_job(dir, {"run.device=\"cpu\""}), false);
    mt::train::Trainer scaled(mt::testing::tiny_job(dir, {"run.device=\"cpu\"", "train.loss_scale=1024"}), false);
    for (int i = 0; i < 6; ++i) {
        const auto a = plain.train_step(), b = scaled.train_step();
        EXPECT_EQ(a.loss, b.loss) << "step " << i + 1;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << i + 1;
        EXPECT_EQ(b.loss_scale, 1024.0);
    }
}

TEST(LossScaler, HalfPrecisionOnTheCpuIsRefused) {
    const std::string dir = mt::testing::fresh_dir("cpu16");
    for (const char* p : {"bf16", "fp16"}) {
        const auto cfg = mt::testing::tiny_job(dir, {"run.device=\"cpu\"", std::string("run.precision=\"") + p + "\""});
        try {
            mt::train::trainer_precision(cfg);
            ADD_FAILURE() << p << " on the CPU was accepted";
        } catch (const mt::core::Error& e) {
            EXPECT_EQ(e.code(), mt::core::ExitCode::usage);
            EXPECT_NE(std::string(e.what()).find("run.precision"), std::string::npos) << e.what();
        }
    }
    const auto auto_cfg = mt::testing::tiny_job(dir, {"run.device=\"cpu\""});
    EXPECT_EQ(mt::train::trainer_precision(auto_cfg).compute, mt::core::DType::f32);
    EXPECT_EQ(mt::train::trainer_loss_scaler(auto_cfg, mt::train::trainer_precision(auto_cfg)).dynamic, false);
}
