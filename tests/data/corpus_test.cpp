// Corpus preparation: fortune splitting, directory listing, the train/val split, token files and stats.json.
#include "data/corpus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/megatron_dataset.h"
#include "data/token_source.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::expect_error;
using testing::ScratchDir;
using testing::write_text;

TEST(DataCorpus, FortuneSplitting) {
    ScratchDir dir;
    write_text(dir.file("f"), "first\nfortune\n%\n%\n  \n%\nsecond -- %\n%\nthird");
    const auto docs = corpus_read_documents(dir.file("f"));
    ASSERT_EQ(docs.size(), 3u);
    EXPECT_EQ(docs[0], "first\nfortune\n");
    EXPECT_EQ(docs[1], "second -- %\n");
    EXPECT_EQ(docs[2], "third");
    write_text(dir.file("plain.txt"), "a whole\nfile 100%\n");
    EXPECT_EQ(corpus_read_documents(dir.file("plain.txt")), std::vector<std::string>{"a whole\nfile 100%\n"});
    write_text(dir.file("blank.txt"), " \n\n");
    EXPECT_TRUE(corpus_read_documents(dir.file("blank.txt")).empty());
}

TEST(DataCorpus, ListFilesSkipsIndexAndHidden) {
    ScratchDir dir;
    std::filesystem::create_directories(dir.file("in"));
    for (const char* name : {"b", "a", "a.dat", ".hidden", "c.txt"})
        write_text(dir.file(std::string("in/") + name), "x");
    std::filesystem::create_symlink(dir.file("in/a"), dir.file("in/a.u8"));
    std::filesystem::create_directories(dir.file("in/sub"));
    const auto files = corpus_list_files({dir.file("in"), dir.file("in/a.dat")});
    const std::vector<std::string> expected = {
        dir.file("in/a"), dir.file("in/b"), dir.file("in/c.txt"), dir.file("in/a.dat")};
    EXPECT_EQ(files, expected);
    expect_error([&] { corpus_list_files({dir.file("nope")}); }, core::ExitCode::data, {"nope"});
}

TEST(DataCorpus, UnigramEntropy) {
    const std::vector<int32_t> uniform = {0, 1, 2, 3};
    EXPECT_NEAR(corpus_unigram_entropy(uniform, 4), std::log(4.0), 1e-12);
    const std::vector<int32_t> constant = {2, 2, 2};
    EXPECT_EQ(corpus_unigram_entropy(constant, 4), 0.0);
}

// Writes two fortune files with n entries each; entry text is unique.
void make_fortunes(const ScratchDir& dir, int n) {
    std::filesystem::create_directories(dir.file("fortunes"));
    for (const char* name : {"alpha", "beta"}) {
        std::string text;
        for (int i = 0; i < n; ++i) text += std::string(name) + " fortune number " + std::to_string(i) + "\n%\n";
        write_text(dir.file(std::string("fortunes/") + name), text);
        write_text(dir.file(std::string("fortunes/") + name + ".dat"), "binary index");
    }
}

TEST(DataCorpus, PrepareLlmcWithStats) {
    ScratchDir dir;
    make_fortunes(dir, 100);
    ByteTokenizer tok;
    CorpusOptions o;
    o.inputs = {dir.file("fortunes")};
    o.out_dir = dir.file("out");
    o.val_fraction = 0.1;
    const CorpusStats s = corpus_prepare(o, tok);
    EXPECT_EQ(s.files, 2);
    EXPECT_EQ(s.documents_train + s.documents_val, 200);
    EXPECT_GT(s.documents_val, 5);
    EXPECT_LT(s.documents_val, 45);
    EXPECT_GT(s.entropy_nats, 1.0);
    EXPECT_NEAR(s.entropy_bits, s.entropy_nats / std::log(2.0), 1e-12);

    auto train = token_source_open("llmc", {dir.file("out/train.bin")}, 257);
    auto val = token_source_open("llmc", {dir.file("out/val.bin")}, 257);
    EXPECT_EQ(train->num_tokens(), s.tokens_train);
    EXPECT_EQ(val->num_tokens(), s.tokens_val);
    std::vector<int32_t> t(static_cast<size_t>(s.tokens_train));
    train->read(0, s.tokens_train, t.data());
    EXPECT_EQ(std::count(t.begin(), t.end(), 256), s.documents_train);
    EXPECT_EQ(t.back(), 256);
    const auto first_eot = std::find(t.begin(), t.end(), 256);
    EXPECT_EQ(tok.decode({t.begin(), first_eot}).rfind("alpha fortune number ", 0), 0u);

    std::ifstream in(dir.file("out/stats.json"));
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["documents"]["train"], s.documents_train);
    EXPECT_EQ(j["tokens"]["val"], s.tokens_val);
    EXPECT_EQ(j["vocab_size"], 257);
    EXPECT_EQ(j["eot_id"], 256);
    EXPECT_DOUBLE_EQ(j["unigram_entropy_nats"].get<double>(), s.entropy_nats);
    EXPECT_DOUBLE_EQ(j["unigram_entropy_bits"].get<double>(), s.entropy_bits);
    EXPECT_FALSE(std::filesystem::exists(dir.file("out/stats.json.tmp")));

    // Deterministic: the same inputs and seed give the same files; another seed gives another split.
    o.out_dir = dir.file("out2");
    const CorpusStats s2 = corpus_prepare(o, tok);
    EXPECT_EQ(s2.tokens_train, s.tokens_train);
    EXPECT_EQ(s2.documents_val, s.documents_val);
    o.out_dir = dir.file("out3");
    o.seed = 77;
    EXPECT_NE(corpus_prepare(o, tok).tokens_val, s.tokens_val);
}

TEST(DataCorpus, PrepareMegatronOneSequencePerDocument) {
    ScratchDir dir;
    make_fortunes(dir, 20);
    ByteTokenizer tok;
    CorpusOptions o;
    o.inputs = {dir.file("fortunes")};
    o.out_dir = dir.file("out");
    o.format = "megatron";
    const CorpusStats s = corpus_prepare(o, tok);
    MegatronDataset train(dir.file("out/train"));
    MegatronDataset val(dir.file("out/val"));
    EXPECT_EQ(train.num_documents(), s.documents_train);
    EXPECT_EQ(val.num_documents(), s.documents_val);
    EXPECT_GE(s.documents_val, 1);  // guaranteed even when no draw falls below 0.05
    EXPECT_EQ(train.num_tokens(), s.tokens_train);
    EXPECT_EQ(train.dtype(), MegatronDType::u16);
}

TEST(DataCorpus, PrepareErrors) {
    ScratchDir dir;
    ByteTokenizer tok;
    CorpusOptions o;
    o.out_dir = dir.file("out");
    write_text(dir.file("one.txt"), "only one document");
    o.inputs = {dir.file("one.txt")};
    expect_error([&] { corpus_prepare(o, tok); }, core::ExitCode::data, {"at least 2"});
    o.inputs = {dir.file("missing")};
    expect_error([&] { corpus_prepare(o, tok); }, core::ExitCode::data, {"missing"});
    o.format = "csv";
    expect_error([&] { corpus_prepare(o, tok); }, core::ExitCode::usage, {"csv"});
}

}  // namespace
}  // namespace mt::data
