// ByteTokenizer, SentencePieceTokenizer and SentencePiece training (libsentencepiece).
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include "core/error.h"

namespace mt::data {

using core::ExitCode;

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string text;
    text.reserve(ids.size());
    for (const int32_t id : ids)
        if (id >= 0 && id < 256) text.push_back(static_cast<char>(id));
    return text;
}

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(model_path, ec))
        core::fail_hint(ExitCode::data,
                        "pass --tokenizer bytes, or train one with `moetrain data --train-tokenizer`.",
                        "tokenizer model not found [{}]",
                        model_path);
    const auto status = sp_->Load(model_path);
    if (!status.ok())
        core::fail_hint(ExitCode::data,
                        "the file is not a SentencePiece model or is corrupt; re-train or re-copy it.",
                        "cannot load SentencePiece model: {} [{}]",
                        status.ToString(),
                        model_path);
    if (sp_->eos_id() < 0)
        core::fail_hint(ExitCode::data,
                        "train the model with an eos piece (eos_id >= 0).",
                        "SentencePiece model has no eos piece to use as end of text [{}]",
                        model_path);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
    std::vector<int> ids;
    const auto status = sp_->Encode(text, &ids);
    if (!status.ok()) core::fail(ExitCode::data, "SentencePiece encode failed: {} [{}]", status.ToString(), path_);
    return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
    std::vector<int> in;
    in.reserve(ids.size());
    for (const int32_t id : ids)
        if (id >= 0 && id < sp_->GetPieceSize()) in.push_back(id);
    std::string text;
    const auto status = sp_->Decode(in, &text);
    if (!status.ok()) core::fail(ExitCode::data, "SentencePiece decode failed: {} [{}]", status.ToString(), path_);
    return text;
}

int64_t SentencePieceTokenizer::vocab_size() const {
    return sp_->GetPieceSize();
}

int32_t SentencePieceTokenizer::eot_id() const {
    return sp_->eos_id();
}

std::unique_ptr<Tokenizer> tokenizer_open(const std::string& spec) {
    if (spec == "bytes") return std::make_unique<ByteTokenizer>();
    return std::make_unique<SentencePieceTokenizer>(spec);
}

std::string tokenizer_train_sentencepiece(const std::vector<std::string>& inputs,
                                          const std::string& model_prefix,
                                          int64_t vocab_size,
                                          const std::string& model_type,
                                          bool byte_fallback) {
    if (inputs.empty()) core::fail(ExitCode::usage, "no input files to train a SentencePiece model on");
    for (const auto& in : inputs) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(in, ec))
            core::fail(ExitCode::data, "tokenizer training input not found [{}]", in);
    }
    std::string joined;
    for (const auto& in : inputs) joined += (joined.empty() ? "" : ",") + in;
    const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
    const std::unordered_map<std::string, std::string> args = {
        {"input", joined},
        {"model_prefix", model_prefix},
        {"vocab_size", std::to_string(vocab_size)},
        {"model_type", model_type},
        {"character_coverage", "1.0"},
        {"byte_fallback", byte_fallback ? "true" : "false"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"split_digits", "true"},
        {"user_defined_symbols", "\n,\t"},
        {"unk_id", "0"},
        {"bos_id", "1"},
        {"eos_id", "2"},
        {"pad_id", "-1"},
        {"hard_vocab_limit", "false"},
        {"num_threads", std::to_string(threads)},
        {"minloglevel", "2"},
    };
    const auto status = sentencepiece::SentencePieceTrainer::Train(args);
    if (!status.ok())
        core::fail_hint(ExitCode::data,
                        "check the input text and --vocab-size (it must exceed the number of "
                        "distinct characters, plus 259 with byte fallback).",
                        "SentencePiece training failed: {} [{}]",
                        status.ToString(),
                        model_prefix);
    return model_prefix + ".model";
}

}  // namespace mt::data
