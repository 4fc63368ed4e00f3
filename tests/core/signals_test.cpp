// Guarded maps and FIFO-safe opens (core/signals.h, core/file_util.h): a SIGBUS on a mapped file that shrank
// becomes an Error naming the file, or without a guard a message and the map's exit code; a file changed under
// its map is noticed; a FIFO fails at once instead of blocking the open.
#include "core/signals.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/file_util.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

class Signals : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = (fs::temp_directory_path() / fmt::format("mt_signals_{}_{}", ::getpid(), info->name())).string();
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        path_ = dir_ + "/shard.bin";
        std::ofstream(path_, std::ios::binary) << std::string(3 * 4096, 'x');
    }
    void TearDown() override {
        fs::remove_all(dir_);
    }
    // Reads every page of the map (a volatile sum, so the loads happen).
    static int64_t touch(const core::MappedFile& map) {
        volatile int64_t sum = 0;
        for (size_t i = 0; i < map.size(); i += 512) sum = sum + map.data()[i];
        return sum;
    }
    std::string dir_, path_;
};

TEST_F(Signals, SigbusOnATruncatedMapBecomesAnErrorNamingTheFile) {
    core::signals_install_fatal(-1);
    const core::MappedFile map(path_, core::ExitCode::data);
    ASSERT_EQ(::truncate(path_.c_str(), 0), 0);
    try {
        core::signals_guard_mapped_reads([&]() { touch(map); });
        FAIL() << "reading a truncated map did not fail";
    } catch (const core::Error& e) {
        EXPECT_EQ(e.code(), core::ExitCode::data);
        EXPECT_NE(std::string(e.what()).find("(SIGBUS) [" + path_ + "]"), std::string::npos) << e.what();
    }
    // The guard is disarmed afterwards and a second guarded read fails the same way (the signal mask came back).
    EXPECT_EQ(core::signals_guard_top(), nullptr);
    EXPECT_THROW(core::signals_guard_mapped_reads([&]() { touch(map); }), core::Error);
}

TEST_F(Signals, ExceptionsPassThroughTheGuard) {
    EXPECT_THROW(core::signals_guard_mapped_reads([]() { throw std::runtime_error("x"); }), std::runtime_error);
    EXPECT_EQ(core::signals_guard_top(), nullptr);
}

TEST_F(Signals, UnguardedSigbusOnAMapNamesTheFileAndExitsWithItsCode) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            core::signals_install_fatal(-1);
            const core::MappedFile map(path_, core::ExitCode::checkpoint);
            if (::truncate(path_.c_str(), 0) != 0) std::_Exit(99);
            touch(map);
            std::_Exit(98);
        },
        ::testing::ExitedWithCode(4),
        "moetrain: error: the file was truncated or overwritten in place while it was mapped \\(SIGBUS\\)");
}

TEST_F(Signals, FatalSignalPrintsABanner) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            core::signals_install_fatal(-1);
            std::raise(SIGFPE);
        },
        ::testing::KilledBySignal(SIGFPE),
        "moetrain: error: fatal signal SIGFPE");
}

TEST_F(Signals, ChangedFilesAreNoticed) {
    const core::MappedFile map(path_, core::ExitCode::data);
    map.check_unchanged();
    auto message = [&]() -> std::string {
        try {
            map.check_unchanged();
        } catch (const core::Error& e) {
            EXPECT_EQ(e.code(), core::ExitCode::data);
            return e.what();
        }
        return "";
    };
    // Rewritten in place with the same size: a new modification time.
    const struct timespec times[2] = {{0, UTIME_OMIT}, {1, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path_.c_str(), times, 0), 0);
    EXPECT_NE(message().find("modified in place"), std::string::npos);
    // Truncated.
    ASSERT_EQ(::truncate(path_.c_str(), 100), 0);
    EXPECT_NE(message().find("12288 bytes when opened, 100 now"), std::string::npos);
    // Replaced by a rename.
    std::ofstream(dir_ + "/new.bin") << "y";
    fs::rename(dir_ + "/new.bin", path_);
    EXPECT_NE(message().find("replaced by another file"), std::string::npos);
    fs::remove(path_);
    EXPECT_NE(message().find("removed or renamed"), std::string::npos);
}

TEST_F(Signals, FifosFailAtOnceInsteadOfBlocking) {
    const std::string fifo = dir_ + "/fifo";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
    for (auto open : std::vector<std::function<void()>>{
             [&]() { core::MappedFile map(fifo, core::ExitCode::data); },
             [&]() { core::read_file(fifo); },
             [&]() { core::file_size(fifo); },
             [&]() { core::file_crc32c(fifo); },
         }) {
        try {
            open();
            FAIL() << "opening a FIFO did not fail";
        } catch (const core::Error& e) {
            EXPECT_NE(std::string(e.what()).find("not a regular file (a FIFO) [" + fifo + "]"), std::string::npos)
                << e.what();
        }
    }
}

}  // namespace
