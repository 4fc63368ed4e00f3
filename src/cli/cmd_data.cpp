// `moetrain data`: tokenize a text corpus (default: the Debian fortunes) into train/val token files, or train a
// SentencePiece BPE tokenizer on it (--train-tokenizer; add --tokenize to also tokenize with the new model). --long-doc
// adds long documents tagged long (a directory tree concatenated), for the context-length curriculum.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/tokenizer.h"

namespace mt::cli {

namespace {

struct DataArgs {
    std::vector<std::string> inputs = {"/usr/share/games/fortunes"};
    std::vector<std::string> long_docs;
    std::string out = "data/fortunes";
    std::string tokenizer = "bytes";
    double val_fraction = 0.05;
    std::string format = "llmc";
    uint64_t seed = 1234;
    bool train_tokenizer = false;
    int64_t vocab_size = 4096;
    std::string model_prefix;  // default <out>/spm
    bool tokenize = false;
};

void run_prepare(const DataArgs& a, const std::string& tokenizer_spec) {
    const auto tokenizer = data::tokenizer_open(tokenizer_spec);
    data::CorpusOptions o;
    o.inputs = a.inputs;
    o.long_docs = a.long_docs;
    o.out_dir = a.out;
    o.format = a.format;
    o.val_fraction = a.val_fraction;
    o.seed = a.seed;
    const auto s = data::corpus_prepare(o, *tokenizer);
    fmt::print(
        "moetrain data: {} docs ({} train / {} val) from {} files, tokens {} train / {} val, vocab {}, "
        "unigram entropy {:.4f} nats = {:.4f} bits per token -> {} [{}, {}]\n",
        s.documents_train + s.documents_val,
        s.documents_train,
        s.documents_val,
        s.files,
        s.tokens_train,
        s.tokens_val,
        tokenizer->vocab_size(),
        s.entropy_nats,
        s.entropy_bits,
        a.out,
        a.format,
        tokenizer->name());
    if (s.documents_long > 0)
        fmt::print("moetrain data: {} long document(s) tagged long in train, {} tokens ({}/train.docs)\n",
                   s.documents_long,
                   s.tokens_long,
                   a.out);
}

void run_data(const DataArgs& a) {
    if (!a.train_tokenizer) {
        if (a.tokenize)
            core::fail(core::ExitCode::usage, "--tokenize goes with --train-tokenizer (tokenizing is the default)");
        run_prepare(a, a.tokenizer);
        return;
    }
    const std::string prefix =
        a.model_prefix.empty() ? (std::filesystem::path(a.out) / "spm").string() : a.model_prefix;
    const auto parent = std::filesystem::path(prefix).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) core::fail(core::ExitCode::data, "cannot create directory: {} [{}]", ec.message(), parent.string());
    const std::string text = prefix + ".train.txt";
    const int64_t docs = data::corpus_write_text(a.inputs, text);
    std::string model;
    try {
        model = data::tokenizer_train_sentencepiece({text}, prefix, a.vocab_size, "bpe", true);
    } catch (...) {
        std::filesystem::remove(text, ec);
        throw;
    }
    std::filesystem::remove(text, ec);
    const data::SentencePieceTokenizer trained(model);
    fmt::print("moetrain data: trained SentencePiece BPE on {} docs: {} (vocab {}, eot id {})\n",
               docs,
               model,
               trained.vocab_size(),
               trained.eot_id());
    if (a.tokenize) run_prepare(a, model);
}

}  // namespace

void register_data(CLI::App& app) {
    auto args = std::make_shared<DataArgs>();
    CLI::App* sub =
        app.add_subcommand("data", "Tokenize a text corpus into train/val token files, or train a tokenizer");
    sub->add_option("--input", args->inputs, "Input file or directory (repeatable; fortune files split on '%' lines)")
        ->capture_default_str();
    sub->add_option("--long-doc",
                    args->long_docs,
                    "File or directory made into one long document tagged long (repeatable; a directory's text files "
                    "at any depth, concatenated in path order), e.g. /usr/share/common-licenses");
    sub->add_option("--out", args->out, "Output directory (train.bin, val.bin, their .docs indexes, stats.json)")
        ->capture_default_str();
    sub->add_option("--tokenizer", args->tokenizer, "\"bytes\" or a SentencePiece .model path")->capture_default_str();
    sub->add_option("--val-fraction", args->val_fraction, "Fraction of documents held out for validation")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    sub->add_option("--format", args->format, "Output format")
        ->check(CLI::IsMember({"llmc", "megatron"}))
        ->capture_default_str();
    sub->add_option("--seed", args->seed, "Seed of the train/val split")->capture_default_str();
    sub->add_flag("--train-tokenizer", args->train_tokenizer, "Train a SentencePiece BPE model instead of tokenizing");
    sub->add_option("--vocab-size", args->vocab_size, "Vocab size of the trained tokenizer")
        ->check(CLI::Range(int64_t{300}, int64_t{1} << 20))
        ->capture_default_str();
    sub->add_option("--model-prefix", args->model_prefix, "Prefix of the trained model (default <out>/spm)");
    sub->add_flag("--tokenize", args->tokenize, "With --train-tokenizer: then tokenize the corpus with the new model");
    sub->callback([args] { run_data(*args); });
}

}  // namespace mt::cli
