// `moetrain data`: tokenize a text corpus (default: the Debian fortunes) into train/val token files, or train a
// SentencePiece BPE tokenizer on it (--train-tokenizer; add --tokenize to also tokenize with the new model). --long-doc
// adds long documents tagged long (a directory tree concatenated), for the context-length curriculum. --images writes
// image-caption data instead: WebDataset tar shards (and a JSONL manifest) from the shapes generator or a folder.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/image_text_write.h"
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
    // --images: image-caption shards (docs/data.md "Image-text data").
    bool images = false;
    std::string images_from;  // a folder of KEY.png|jpg + KEY.txt; empty: the shapes generator
    int64_t count = 1000;
    std::string split = "train";
    int64_t stage = 4;
    int64_t per_shard = 1000;
    std::string image_format = "png";
    bool manifest = false;
};

void run_images(const DataArgs& a, bool out_given) {
    data::ImageTextWriteOptions o;
    o.out_dir = out_given ? a.out : "data/shapes_images";
    o.prefix = a.images_from.empty() ? a.split : "train";
    o.per_shard = a.per_shard;
    o.format = a.image_format == "jpeg" ? data::ImageFormat::jpeg : data::ImageFormat::png;
    o.manifest = a.manifest;
    data::ImageTextWriteResult r;
    std::string from = a.images_from;
    if (a.images_from.empty()) {
        data::ShapesOptions shapes;
        shapes.seed = a.seed;
        shapes.stage = static_cast<int>(a.stage);
        const data::ShapesSplit split = a.split == "train" ? data::ShapesSplit::train
                                        : a.split == "val" ? data::ShapesSplit::val
                                                           : data::ShapesSplit::comp_val;
        r = data::image_text_write_shapes(shapes, split, a.count, o);
        from = fmt::format("shapes {} split, stage {}, seed {}, {}", a.split, a.stage, a.seed, a.image_format);
    } else {
        r = data::image_text_write_folder(a.images_from, o);
    }
    fmt::print("moetrain data: {} image-caption samples ({}) in {} tar shard(s): {}{}\n",
               r.samples,
               from,
               r.shards.size(),
               r.shards.size() == 1 ? r.shards.front() : fmt::format("{} ... {}", r.shards.front(), r.shards.back()),
               r.manifest.empty() ? "" : fmt::format(" and manifest {}", r.manifest));
}

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

void run_data(const DataArgs& a, bool out_given) {
    if (a.images) {
        if (a.train_tokenizer)
            core::fail(core::ExitCode::usage, "--images writes image shards: drop --train-tokenizer");
        run_images(a, out_given);
        return;
    }
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
    sub->add_flag("--images",
                  args->images,
                  "Write image-caption WebDataset tar shards (KEY.png + KEY.txt) instead of token files; --out "
                  "defaults to data/shapes_images");
    sub->add_option(
        "--images-from",
        args->images_from,
        "With --images: a folder of KEY.png|jpg images with KEY.txt captions (default: the shapes generator)");
    sub->add_option("--count", args->count, "With --images: shapes samples to write")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
        ->capture_default_str();
    sub->add_option("--split", args->split, "With --images: the shapes split (also the file prefix)")
        ->check(CLI::IsMember({"train", "val", "comp-val"}))
        ->capture_default_str();
    sub->add_option("--stage", args->stage, "With --images: the shapes debug-ladder stage (1 color only ... 4 full)")
        ->check(CLI::Range(1, 4))
        ->capture_default_str();
    sub->add_option("--per-shard", args->per_shard, "With --images: samples per tar shard")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
        ->capture_default_str();
    sub->add_option("--image-format", args->image_format, "With --images: how shapes images are encoded")
        ->check(CLI::IsMember({"png", "jpeg"}))
        ->capture_default_str();
    sub->add_flag("--manifest",
                  args->manifest,
                  "With --images: also write the images as files and a JSONL manifest <out>/<split>.jsonl");
    CLI::Option* out = sub->get_option("--out");
    sub->callback([args, out] { run_data(*args, out->count() > 0); });
}

}  // namespace mt::cli
