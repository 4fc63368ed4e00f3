// `moetrain data` through CLI11 (register_data), before and independent of main(): tokenize and train.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "data/megatron_dataset.h"
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

// Every token of one token file, through the reader training uses.
std::vector<int32_t> read_tokens(std::string_view format, const std::string& path) {
    auto src = token_source_open(format, {path}, 257);
    std::vector<int32_t> out(static_cast<size_t>(src->num_tokens()));
    src->read(0, src->num_tokens(), out.data());
    return out;
}

// The Megatron files hold exactly the tokens of the llm.c shards written from the same corpus and split, and one
// sequence (= one document) per EOT-terminated document of the shard.
TEST(DataCli, TokenizeBytesMegatron) {
    ScratchDir dir;
    make_inputs(dir);
    for (const std::string format : {"llmc", "megatron"})
        run_cli({"data",
                 "--input",
                 dir.file("in"),
                 "--out",
                 dir.file("out_" + format),
                 "--format",
                 format,
                 "--val-fraction",
                 "0.1"});
    EXPECT_TRUE(std::filesystem::exists(dir.file("out_megatron/train.idx")));
    EXPECT_TRUE(std::filesystem::exists(dir.file("out_megatron/val.bin")));
    const int32_t eot = 256;  // the byte tokenizer's EOT, after every document
    for (const std::string split : {"train", "val"}) {
        const std::vector<int32_t> llmc = read_tokens("llmc", dir.file("out_llmc/" + split + ".bin"));
        const std::vector<int32_t> meg = read_tokens("megatron", dir.file("out_megatron/" + split));
        EXPECT_GT(llmc.size(), split == "train" ? 10000u : 100u) << split;
        ASSERT_EQ(meg.size(), llmc.size()) << split;
        // The first difference, not the two 20,000-token vectors.
        const auto [a, b] = std::mismatch(llmc.begin(), llmc.end(), meg.begin());
        EXPECT_TRUE(a == llmc.end()) << split << ": token " << (a - llmc.begin()) << " is " << *a << " in the llm.c "
                                     << "shard, " << *b << " in the Megatron dataset";
        // Document boundaries: sequence i ends at the i-th EOT of the shard and holds no other EOT; each document is
        // one sequence (document_indices = 0, 1, ..., S).
        const MegatronDataset ds(dir.file("out_megatron/" + split));
        const auto eots = static_cast<int64_t>(std::count(llmc.begin(), llmc.end(), eot));
        ASSERT_EQ(ds.num_sequences(), eots) << split;
        EXPECT_EQ(ds.num_documents(), eots) << split;
        int64_t start = 0, bad = 0;
        for (int64_t i = 0; i < ds.num_sequences(); ++i) {
            const int64_t len = ds.sequence_length(i);
            if (len < 1 || start + len > static_cast<int64_t>(llmc.size())) {
                ADD_FAILURE() << split << ": sequence " << i << " of " << len << " tokens at token " << start;
                break;
            }
            const auto first = llmc.begin() + start, last = first + len - 1;
            bad += *last != eot || std::find(first, last, eot) != last || ds.document_index(i) != i;
            start += len;
        }
        EXPECT_EQ(bad, 0) << split << ": sequences that are not exactly one EOT-terminated document";
        EXPECT_EQ(start, static_cast<int64_t>(llmc.size())) << split;
    }
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
