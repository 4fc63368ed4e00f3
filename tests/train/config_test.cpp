// Job config: parsing, overrides, and every kind of bad input naming the file and field.
#include "train/config.h"

#include <gtest/gtest.h>

#include "core/error.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::train::config_load;
using mt::train::config_parse;

namespace {

const char* kGood = R"(
[model]
d_model = 64
n_heads = 4
n_kv_heads = 2
[data]
paths = ["a.bin"]
[train]
lr = 1e-3
seq_len = 32
)";

// Runs f, expects an Error with the given code whose message contains every needle.
template <typename F>
void expect_error(F&& f, ExitCode code, std::initializer_list<const char*> needles) {
    try {
        f();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(Config, ParsesAndOverrides) {
    auto c = config_parse(kGood, "job.toml", {"train.steps=7", "run.name=abc", "data.val_paths=[\"v.bin\"]"});
    EXPECT_EQ(c.model.d_model, 64);
    EXPECT_EQ(c.model.n_kv_heads, 2);
    EXPECT_EQ(c.train.lr, 1e-3);
    EXPECT_EQ(c.train.steps, 7);
    EXPECT_EQ(c.run.name, "abc");
    ASSERT_EQ(c.data.val_paths.size(), 1u);
    // The resolved TOML parses back to the same config.
    auto again = config_parse(c.to_toml(), "resolved");
    EXPECT_EQ(again.to_toml(), c.to_toml());
    EXPECT_EQ(again.train.steps, 7);
}

TEST(Config, IntegerAcceptedWhereNumberExpected) {
    auto c = config_parse(kGood, "job.toml", {"train.lr=1"});
    EXPECT_EQ(c.train.lr, 1.0);
}

TEST(Config, MalformedTomlNamesFileAndLine) {
    expect_error([] { config_parse("[model]\nd_model = = 3\n", "bad.toml"); },
                 ExitCode::usage,
                 {"malformed TOML", "line 2", "bad.toml"});
}

TEST(Config, UnknownKeySuggestsTheRightOne) {
    try {
        config_parse(std::string(kGood) + "stpes = 3\n", "job.toml");
        FAIL();
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::usage);
        EXPECT_NE(std::string(e.what()).find("train.stpes"), std::string::npos);
        EXPECT_NE(e.hint().find("train.steps"), std::string::npos);
    }
    expect_error([] { config_parse(kGood, "job.toml", {"modle.d_model=3"}); }, ExitCode::usage, {"modle.d_model"});
}

TEST(Config, WrongTypeNamesField) {
    expect_error([] { config_parse(kGood, "job.toml", {"train.steps=\"ten\""}); },
                 ExitCode::usage,
                 {"train.steps", "integer", "job.toml"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"model.tie_embeddings=3"}); }, ExitCode::usage, {"model.tie_embeddings"});
    expect_error([] { config_parse(kGood, "job.toml", {"data.paths=3"}); }, ExitCode::usage, {"data.paths"});
}

TEST(Config, OutOfRangeNamesField) {
    expect_error(
        [] { config_parse(kGood, "job.toml", {"train.lr=-0.1"}); }, ExitCode::usage, {"train.lr", "out of range"});
    expect_error(
        [] { config_parse(kGood, "job.toml", {"train.batch_size=0"}); }, ExitCode::usage, {"train.batch_size"});
    expect_error([] { config_parse(kGood, "job.toml", {"train.schedule=\"linear\""}); },
                 ExitCode::usage,
                 {"train.schedule", "cosine"});
    expect_error([] { config_parse(kGood, "job.toml", {"model.n_kv_heads=3"}); }, ExitCode::usage, {"n_kv_heads"});
    expect_error([] { config_parse(kGood, "job.toml", {"train.seq_len=100000"}); }, ExitCode::usage, {"max_seq_len"});
}

TEST(Config, MissingFileIsNamed) {
    expect_error([] { config_load("/nonexistent/job.toml"); }, ExitCode::usage, {"/nonexistent/job.toml"});
}

TEST(Config, MalformedOverride) {
    expect_error([] { config_parse(kGood, "job.toml", {"steps"}); }, ExitCode::usage, {"steps"});
}
