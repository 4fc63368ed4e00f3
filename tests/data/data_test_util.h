// Helpers for the data tests: a unique scratch directory per test, an expectation on mt::core::Error, and quiet
// image-text dataset options.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "data/image_text_dataset.h"

namespace mt::data::testing {

class ScratchDir {
   public:
    ScratchDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        static int counter = 0;
        path_ = std::filesystem::path(::testing::TempDir()) /
                (std::string("mt_") + info->test_suite_name() + "_" + info->name() + "_" + std::to_string(::getpid()) +
                 "_" + std::to_string(counter++));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const {
        return (path_ / name).string();
    }
    const std::filesystem::path& path() const {
        return path_;
    }

   private:
    std::filesystem::path path_;
};

inline void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

// Runs fn and expects an Error with the given exit code whose message contains every one of the needles.
inline void expect_error(const std::function<void()>& fn,
                         core::ExitCode code,
                         std::initializer_list<std::string> needles) {
    try {
        fn();
        ADD_FAILURE() << "expected an mt::core::Error";
    } catch (const core::Error& e) {
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
        for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

// Dataset options without the indexing warnings (the tests count the skipped samples instead).
inline ImageTextDatasetOptions quiet(bool skip_bad_samples = false) {
    ImageTextDatasetOptions o;
    o.skip_bad_samples = skip_bad_samples;
    o.log = false;
    return o;
}

}  // namespace mt::data::testing
