// Tokenizers: byte round trip, SentencePiece training on a small generated corpus, and load errors.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <string>

#include "core/rng.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using testing::expect_error;
using testing::ScratchDir;

TEST(DataTokenizer, BytesRoundTrip) {
    ByteTokenizer tok;
    EXPECT_EQ(tok.vocab_size(), 257);
    EXPECT_EQ(tok.eot_id(), 256);
    std::string text = "Hello, wörld!\n\t%";
    text.push_back('\0');
    text.push_back(static_cast<char>(0xff));
    const auto ids = tok.encode(text);
    ASSERT_EQ(ids.size(), text.size());
    EXPECT_EQ(ids[0], 'H');
    EXPECT_EQ(ids.back(), 255);
    EXPECT_EQ(tok.decode(ids), text);
    auto with_eot = ids;
    with_eot.push_back(tok.eot_id());
    EXPECT_EQ(tok.decode(with_eot), text);
    EXPECT_EQ(tokenizer_open("bytes")->name(), "bytes");
}

// Sentences of pseudo-random words drawn from a small lexicon.
std::string make_corpus(int lines) {
    const char* words[] = {"the",
                           "quick",
                           "brown",
                           "fox",
                           "jumps",
                           "over",
                           "lazy",
                           "dog",
                           "moe",
                           "expert",
                           "router",
                           "token",
                           "train",
                           "loss",
                           "gradient",
                           "layer"};
    std::string text;
    for (int l = 0; l < lines; ++l) {
        const int n = 3 + static_cast<int>(core::rng_u64(1, 0, static_cast<uint64_t>(l)) % 8);
        for (int w = 0; w < n; ++w) {
            text += words[core::rng_u64(1, 1, static_cast<uint64_t>(l * 16 + w)) % 16];
            text += w + 1 < n ? " " : ".\n";
        }
    }
    return text;
}

TEST(DataTokenizer, SentencePieceTrainEncodeDecode) {
    ScratchDir dir;
    testing::write_text(dir.file("corpus.txt"), make_corpus(400));
    const std::string model =
        tokenizer_train_sentencepiece({dir.file("corpus.txt")}, dir.file("spm"), 300, "bpe", false);
    EXPECT_EQ(model, dir.file("spm.model"));
    ASSERT_TRUE(std::filesystem::exists(model));
    auto tok = tokenizer_open(model);
    EXPECT_EQ(tok->name(), model);
    EXPECT_EQ(tok->eot_id(), 2);
    EXPECT_GT(tok->vocab_size(), 50);
    EXPECT_LE(tok->vocab_size(), 300);
    const std::string text = "the lazy  router jumps.\nover the expert  dog.\n\ttoken";
    const auto ids = tok->encode(text);
    EXPECT_LT(ids.size(), text.size() / 2);  // BPE merged the frequent words
    for (const int32_t id : ids) {
        EXPECT_GE(id, 3);  // no unk/bos/eos for known text
        EXPECT_LT(id, tok->vocab_size());
    }
    EXPECT_EQ(tok->decode(ids), text);
    auto with_eot = ids;
    with_eot.push_back(tok->eot_id());
    EXPECT_EQ(tok->decode(with_eot), text);
}

TEST(DataTokenizer, SentencePieceByteFallbackEncodesAnything) {
    ScratchDir dir;
    testing::write_text(dir.file("corpus.txt"), make_corpus(300));
    const std::string model = tokenizer_train_sentencepiece({dir.file("corpus.txt")}, dir.file("bf"), 400);
    SentencePieceTokenizer tok(model);
    const std::string text = "zebra Ω fox\n";  // unseen characters
    const auto ids = tok.encode(text);
    for (const int32_t id : ids) EXPECT_NE(id, 0);  // never unk
    EXPECT_EQ(tok.decode(ids), text);
}

TEST(DataTokenizer, SentencePieceLoadErrors) {
    ScratchDir dir;
    expect_error([&] { tokenizer_open(dir.file("missing.model")); }, core::ExitCode::data, {"missing.model"});
    testing::write_text(dir.file("corrupt.model"), "this is not a protobuf \x01\x02\x03");
    expect_error([&] { tokenizer_open(dir.file("corrupt.model")); }, core::ExitCode::data, {"corrupt.model"});
    expect_error([&] { tokenizer_train_sentencepiece({dir.file("nothing.txt")}, dir.file("x"), 300); },
                 core::ExitCode::data,
                 {"nothing.txt"});
}

}  // namespace
}  // namespace mt::data
