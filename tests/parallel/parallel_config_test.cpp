// The [parallel] config keys and the trainer's refusal of layouts it cannot run, in one process without MPI.
#include <gtest/gtest.h>

#include "core/error.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

using mt::core::Error;
using mt::core::ExitCode;

namespace {

template <typename F>
void expect_usage_error(F&& f, std::initializer_list<const char*> needles) {
    try {
        f();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage) << e.what();
        for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(ParallelConfig, KeysParseAndRejectBadValues) {
    const std::string dir = mt::testing::fresh_dir("cfg");
    const auto cfg = mt::testing::tiny_job(dir, {"parallel.dp=2", "parallel.bucket_mb=0.5"});
    EXPECT_EQ(cfg.parallel.dp, 2);
    EXPECT_EQ(cfg.parallel.tp, 1);
    EXPECT_EQ(cfg.parallel.bucket_mb, 0.5);
    EXPECT_EQ(mt::testing::tiny_job(dir).parallel.dp, 0);  // the default fills the world
    expect_usage_error([&] { mt::testing::tiny_job(dir, {"parallel.tp=0"}); }, {"parallel.tp"});
    expect_usage_error([&] { mt::testing::tiny_job(dir, {"parallel.bucket_mb=0"}); }, {"parallel.bucket_mb"});
}

TEST(ParallelConfig, TrainerRefusesLayoutsItCannotRun) {
    const std::string dir = mt::testing::fresh_dir("layout");
    // One process cannot hold dp = 2.
    expect_usage_error([&] { mt::train::Trainer t(mt::testing::tiny_job(dir, {"parallel.dp=2"}), false); },
                       {"parallel.tp x cp x ep x dp x pp", "1 process"});
    expect_usage_error([&] { mt::train::Trainer t(mt::testing::tiny_job(dir, {"parallel.ep=2"}), false); },
                       {"parallel.ep = 2", "moe.enabled"});
}
