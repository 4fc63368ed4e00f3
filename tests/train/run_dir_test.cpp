// run.dir checks and the lock (train/run_lock.h), the metrics log on failing and torn files (train/metrics.h), and
// config drift on resume (train/config_drift.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "train/config.h"
#include "train/config_drift.h"
#include "train/metrics.h"
#include "train/run_lock.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

class RunDir : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = (fs::temp_directory_path() / fmt::format("mt_rundir_{}_{}", ::getpid(), info->name())).string();
        fs::remove_all(dir_);
    }
    void TearDown() override {
        fs::remove_all(dir_);
    }
    static std::string slurp(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    }
    std::string dir_;
};

std::string error_of(const std::function<void()>& fn, core::ExitCode code) {
    try {
        fn();
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
}

TEST_F(RunDir, ASecondLockOnTheSameDirectoryFailsNamingTheHolder) {
    {
        const train::RunLock first(dir_, "job.toml");
        ASSERT_TRUE(first.held());
        EXPECT_NE(slurp(dir_ + "/.lock").find(fmt::format("pid={}\n", ::getpid())), std::string::npos);
        // flock(2) locks belong to open file descriptions, so a second open in this process contends like another
        // process would.
        const std::string msg = error_of([&]() { train::RunLock second(dir_, "job.toml"); }, core::ExitCode::usage);
        EXPECT_NE(msg.find(fmt::format("is in use by another training: PID {} on host", ::getpid())), std::string::npos)
            << msg;
        EXPECT_NE(msg.find(dir_ + "/.lock"), std::string::npos) << msg;
    }
    EXPECT_EQ(slurp(dir_ + "/.lock"), "") << "a clean release empties the lock file";
    const train::RunLock again(dir_, "job.toml");
    EXPECT_TRUE(again.held());
}

TEST_F(RunDir, BadRunDirsAreUsageErrorsNamingRunDir) {
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/file") << "x";
    EXPECT_NE(error_of([&]() { train::run_dir_prepare(dir_ + "/file", "job.toml"); }, core::ExitCode::usage)
                  .find("exists but is not a directory"),
              std::string::npos);
    EXPECT_NE(error_of([&]() { train::run_dir_prepare(dir_ + "/file/sub", "job.toml"); }, core::ExitCode::usage)
                  .find("cannot be created"),
              std::string::npos);
    EXPECT_NE(
        error_of([&]() { train::run_dir_prepare("", "job.toml"); }, core::ExitCode::usage).find("run.dir is empty"),
        std::string::npos);
}

TEST_F(RunDir, MetricsLogCutsATornTailAndFailsWithTheIoCode) {
    fs::create_directories(dir_);
    const std::string path = dir_ + "/metrics.jsonl";
    std::ofstream(path, std::ios::binary) << "{\"step\":0}\n{\"step\":1,\"kin";
    {
        train::MetricsLog log(path);
        log.write(2, "train", {{"loss", 1.5}});
    }
    const std::string text = slurp(path);
    EXPECT_EQ(text.rfind("{\"step\":0}\n{\"kind\":\"train\",\"loss\":1.5,\"step\":2,", 0), 0u) << text;
    EXPECT_EQ(text.back(), '\n');
    if (fs::exists("/dev/full")) {
        train::MetricsLog full("/dev/full");
        const std::string msg = error_of([&]() { full.write(0, "train", {{"loss", 1.0}}); }, core::ExitCode::io);
        EXPECT_NE(msg.find("No space left on device [/dev/full]"), std::string::npos) << msg;
    }
}

TEST(ConfigDrift, ListsTheKeysThatBreakExactResumeOnly) {
    train::JobConfig a = train::config_parse("[data]\npaths = [\"a.bin\"]\n", "a.toml");
    train::JobConfig b = a;
    EXPECT_TRUE(train::config_drift(a.to_toml(), b.to_toml()).empty());
    b.run.seed = 7;
    b.train.seq_len = 64;
    b.data.paths = {"b.bin"};
    b.train.steps = 1000;  // extending a run is not drift
    b.run.dir = "elsewhere";
    b.checkpoint.every_steps = 5;
    b.parallel.dp = 2;
    const auto drift = train::config_drift(a.to_toml(), b.to_toml());
    ASSERT_EQ(drift.size(), 3u);
    EXPECT_EQ(drift[0].key, "data.paths");
    EXPECT_EQ(drift[1].key, "run.seed");
    EXPECT_EQ(drift[1].saved, "1234");
    EXPECT_EQ(drift[1].now, "7");
    EXPECT_EQ(drift[2].key, "train.seq_len");
}

TEST(ConfigMessages, NameWhatIsWrong) {
    auto msg = [](const std::string& toml, const std::vector<std::string>& overrides = {}) {
        return error_of([&]() { train::config_parse("[data]\npaths = [\"a.bin\"]\n" + toml, "j.toml", overrides); },
                        core::ExitCode::usage);
    };
    EXPECT_NE(error_of([]() { train::config_parse("model = \"big\"\n[data]\npaths = [\"a.bin\"]\n", "j.toml"); },
                       core::ExitCode::usage)
                  .find("config value `model` must be a table, got string"),
              std::string::npos);
    EXPECT_NE(msg("", {"train.steps=1234567890123456789012345678901"}).find("is not valid TOML"), std::string::npos);
    EXPECT_NE(msg("", {"train.steps=9223372036854775807"})
                  .find("train.steps = 9223372036854775807 is out of range: must be >= 0 and <= 1000000000000"),
              std::string::npos);
    EXPECT_NE(msg("", {"run.dir=\"\""}).find("run.dir is empty"), std::string::npos);
    // Bare words stay strings, paths that start with a digit or a dot included.
    EXPECT_EQ(train::config_parse("[data]\npaths = [\"a.bin\"]\n", "j.toml", {"run.dir=2024-01-runs"}).run.dir,
              "2024-01-runs");
    EXPECT_EQ(train::config_parse("[data]\npaths = [\"a.bin\"]\n", "j.toml", {"run.dir=./runs/x"}).run.dir, "./runs/x");
    EXPECT_TRUE(train::config_parse("[data]\npaths = [\"a.bin\"]\n", "j.toml").checkpoint.verify_on_resume);
    EXPECT_NE(error_of([]() { train::config_load(fs::temp_directory_path().string()); }, core::ExitCode::usage)
                  .find("not a regular file (a directory)"),
              std::string::npos);
}

}  // namespace
