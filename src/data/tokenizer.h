// Tokenizers: raw bytes (256 byte ids + EOT) and SentencePiece models, behind one small interface, plus
// SentencePiece BPE training for `moetrain data --train-tokenizer`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mt::data {

class Tokenizer {
   public:
    virtual ~Tokenizer() = default;
    virtual std::vector<int32_t> encode(std::string_view text) const = 0;
    // Text of the ids; EOT and other control ids produce no text.
    virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
    virtual int64_t vocab_size() const = 0;
    // The end-of-text id appended after every document.
    virtual int32_t eot_id() const = 0;
    // "bytes" or the model path.
    virtual std::string name() const = 0;
};

// ids 0..255 are the bytes of the UTF-8 text, id 256 is EOT; vocab 257.
class ByteTokenizer final : public Tokenizer {
   public:
    static constexpr int32_t kEot = 256;
    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t>& ids) const override;
    int64_t vocab_size() const override {
        return 257;
    }
    int32_t eot_id() const override {
        return kEot;
    }
    std::string name() const override {
        return "bytes";
    }
};

// A SentencePiece .model; EOT is the model's eos id (models without one are rejected).
class SentencePieceTokenizer final : public Tokenizer {
   public:
    // Throws Error(ExitCode::data) naming the file when it is missing, corrupt or has no eos piece.
    explicit SentencePieceTokenizer(const std::string& model_path);
    ~SentencePieceTokenizer() override;

    std::vector<int32_t> encode(std::string_view text) const override;
    std::string decode(const std::vector<int32_t>& ids) const override;
    int64_t vocab_size() const override;
    int32_t eot_id() const override;
    std::string name() const override {
        return path_;
    }

   private:
    std::string path_;
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// "bytes" gives a ByteTokenizer; anything else is the path of a SentencePiece .model.
std::unique_ptr<Tokenizer> tokenizer_open(const std::string& spec);

// Trains a SentencePiece model on text files (one sentence per line) and writes MODEL_PREFIX.model and
// MODEL_PREFIX.vocab. Ids: 0 unk, 1 bos, 2 eos (the EOT), no pad. Normalization is the identity and whitespace
// is kept, so decode(encode(text)) == text for text made of pieces the model knows; "\n" and "\t" are
// user-defined pieces. byte_fallback (needs vocab_size > ~260 + distinct characters) makes every byte encodable.
// Returns the .model path. Failures throw Error(ExitCode::data).
// @param[in] inputs         training text files
// @param[in] model_prefix   output prefix
// @param[in] vocab_size     pieces in the model
// @param[in] model_type     "bpe" (default) or "unigram", "char", "word"
// @param[in] byte_fallback  add the 256 byte pieces
std::string tokenizer_train_sentencepiece(const std::vector<std::string>& inputs,
                                          const std::string& model_prefix,
                                          int64_t vocab_size,
                                          const std::string& model_type = "bpe",
                                          bool byte_fallback = true);

}  // namespace mt::data
