// `moetrain data` through CLI11 (register_data), before and independent of main(): tokenize and train.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/token_source.h"
#include "data/tokenizer.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::ScratchDir;

void run_cli(std::vector<std::string> args) {
    CLI::App app("moetrain");
    app.require_subcommand(1);
    cli::register_data(app);
    args.insert(args.begin(), "moetrain");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    app.parse(static_cast<int>(argv.size()), argv.data());
}

void make_inputs(const ScratchDir& dir) {
    std::filesystem::create_directories(dir.file("in"));
    std::string text;
    for (int i = 0; i < 300; ++i)
        text += "fortune " + std::to_string(i) + ": the router sends every token to its experts.\n%\n";
    testing::write_text(dir.file("in/cookies"), text);
}

TEST(DataCli, TokenizeBytesMegatron) {
    ScratchDir dir;
    make_inputs(dir);
    run_cli(
        {"data", "--input", dir.file("in"), "--out", dir.file("out"), "--format", "megatron", "--val-fraction", "0.1"});
    EXPECT_TRUE(std::filesystem::exists(dir.file("out/train.idx")));
    EXPECT_TRUE(std::filesystem::exists(dir.file("out/val.bin")));
    auto src = token_source_open("megatron", {dir.file("out/train")}, 257);
    EXPECT_GT(src->num_tokens(), 10000);
}

TEST(DataCli, TrainTokenizerThenTokenize) {
    ScratchDir dir;
    make_inputs(dir);
    run_cli({"data",
             "--input",
             dir.file("in"),
             "--out",
             dir.file("out"),
             "--train-tokenizer",
             "--vocab-size",
             "320",
             "--tokenize"});
    ASSERT_TRUE(std::filesystem::exists(dir.file("out/spm.model")));
    EXPECT_FALSE(std::filesystem::exists(dir.file("out/spm.train.txt")));
    std::ifstream in(dir.file("out/stats.json"));
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["tokenizer"], dir.file("out/spm.model"));
    EXPECT_EQ(j["eot_id"], 2);
    const int64_t vocab = j["vocab_size"];
    auto src = token_source_open("llmc", {dir.file("out/train.bin")}, vocab);
    EXPECT_GT(src->num_tokens(), 100);
}

TEST(DataCli, MissingInputIsDataError) {
    ScratchDir dir;
    testing::expect_error(
        [&] {
            run_cli({"data", "--input", dir.file("none"), "--out", dir.file("out")});
        },
        core::ExitCode::data,
        {"none"});
}

}  // namespace
}  // namespace mt::data
