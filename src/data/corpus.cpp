// Reads documents, splits train/val by a keyed hash, tokenizes, and writes llm.c or Megatron files + stats.json.
#include "data/corpus.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "core/rng.h"
#include "data/doc_index.h"
#include "data/llmc_shard.h"
#include "data/megatron_dataset.h"

namespace mt::data {

using core::ExitCode;
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) core::fail(ExitCode::data, "cannot read input file [{}]", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A uniform draw in [0, 1) for a document, keyed by the seed and the document's text.
double split_draw(uint64_t seed, const std::string& text) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over every byte (text may hold NULs)
    for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return static_cast<double>(core::rng_u64(seed, core::hash_name("mt.data.split"), h) >> 11) * 0x1.0p-53;
}

struct Split {
    std::vector<int32_t> tokens;
    std::vector<int64_t> lengths;
    std::vector<uint8_t> tagged;  // per document: 1 for a long document
};

bool skipped_in_tree(const std::string& name) {
    for (const char* ext : {".gz", ".xz", ".bz2", ".zst", ".dat", ".u8"})
        if (ends_with(name, ext)) return true;
    return name.empty() || name[0] == '.';
}

void write_split(const CorpusOptions& o, const std::string& name, const Split& s, int64_t vocab) {
    const std::string base = (fs::path(o.out_dir) / name).string();
    if (o.format == "llmc")
        llmc_write_shard(base + ".bin", s.tokens, vocab);
    else
        megatron_write_dataset(base, s.tokens, s.lengths, megatron_dtype_for_vocab(vocab));
    doc_index_write(doc_index_sidecar(base), s.lengths, s.tagged);
}

}  // namespace

std::vector<std::string> corpus_list_files(const std::vector<std::string>& inputs) {
    std::vector<std::string> files;
    for (const auto& input : inputs) {
        std::error_code ec;
        if (fs::is_directory(input, ec)) {
            std::vector<std::string> found;
            for (const auto& entry : fs::directory_iterator(input, ec)) {
                const std::string name = entry.path().filename().string();
                if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
                std::error_code ec2;
                if (entry.is_regular_file(ec2)) found.push_back(entry.path().string());
            }
            if (ec) core::fail(ExitCode::data, "cannot list input directory: {} [{}]", ec.message(), input);
            std::sort(found.begin(), found.end());
            files.insert(files.end(), found.begin(), found.end());
        } else if (fs::is_regular_file(input, ec)) {
            files.push_back(input);
        } else {
            core::fail_hint(ExitCode::data,
                            "on Debian, `apt-get install fortunes fortunes-min` provides /usr/share/games/fortunes; "
                            "or pass --input FILE_OR_DIR.",
                            "input not found [{}]",
                            input);
        }
    }
    return files;
}

std::string corpus_read_tree(const std::string& path) {
    std::error_code ec;
    const auto status = fs::symlink_status(path, ec);
    if (!fs::exists(fs::status(path, ec)))
        core::fail_hint(ExitCode::data,
                        "pass a file or a directory of text, e.g. --long-doc /usr/share/common-licenses.",
                        "long document input not found [{}]",
                        path);
    std::vector<std::string> files;
    if (fs::is_directory(fs::status(path, ec))) {
        for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
             it.increment(ec)) {
            const std::string name = it->path().filename().string();
            if (skipped_in_tree(name)) {
                if (it->is_directory()) it.disable_recursion_pending();
                continue;
            }
            std::error_code ec2;
            if (it->is_regular_file(ec2) && !it->is_symlink(ec2)) files.push_back(it->path().string());
        }
        if (ec) core::fail(ExitCode::data, "cannot list long document directory: {} [{}]", ec.message(), path);
        std::sort(files.begin(), files.end());
    } else if (!fs::is_symlink(status)) {
        files.push_back(path);
    } else {
        files.push_back(fs::canonical(path, ec).string());
    }
    std::string doc;
    for (const auto& f : files) {
        const std::string text = read_file(f);
        if (text.find('\0') != std::string::npos || is_blank(text)) continue;
        doc += text;
        if (doc.back() != '\n') doc += '\n';
    }
    if (doc.empty())
        core::fail_hint(ExitCode::data,
                        "point --long-doc at text files (compressed, binary and hidden files are skipped).",
                        "long document input holds no text file [{}]",
                        path);
    return doc;
}

std::vector<std::string> corpus_read_documents(const std::string& path) {
    const std::string text = read_file(path);
    std::vector<std::string> lines;
    bool fortune = false;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        end = end == std::string::npos ? text.size() : end + 1;
        lines.push_back(text.substr(pos, end - pos));
        if (lines.back() == "%\n" || lines.back() == "%") fortune = true;
        pos = end;
    }
    std::vector<std::string> docs;
    if (!fortune) {
        if (!is_blank(text)) docs.push_back(text);
        return docs;
    }
    std::string current;
    for (const auto& line : lines) {
        if (line == "%\n" || line == "%") {
            if (!is_blank(current)) docs.push_back(current);
            current.clear();
        } else {
            current += line;
        }
    }
    if (!is_blank(current)) docs.push_back(current);
    return docs;
}

double corpus_unigram_entropy(std::span<const int32_t> tokens, int64_t vocab_size) {
    if (tokens.empty()) return 0.0;
    std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
    for (const int32_t t : tokens) {
        MT_CHECK(t >= 0 && t < vocab_size, "token {} outside vocab {}", t, vocab_size);
        ++counts[static_cast<size_t>(t)];
    }
    const double n = static_cast<double>(tokens.size());
    double h = 0.0;
    for (const int64_t c : counts)
        if (c > 0) h -= (c / n) * std::log(c / n);
    return h;
}

CorpusStats corpus_prepare(const CorpusOptions& o, const Tokenizer& tokenizer) {
    if (o.format != "llmc" && o.format != "megatron")
        core::fail(ExitCode::usage, "unknown data format \"{}\" (expected \"llmc\" or \"megatron\")", o.format);
    if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
        core::fail(ExitCode::usage, "val fraction must lie in (0, 1), got {}", o.val_fraction);
    const auto files = corpus_list_files(o.inputs);
    std::vector<std::string> docs;
    for (const auto& f : files) {
        auto d = corpus_read_documents(f);
        docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
    }
    if (docs.size() < 2)
        core::fail_hint(ExitCode::data,
                        "pass more text with --input.",
                        "the inputs hold {} non-empty document(s); a train/val split needs at least 2",
                        docs.size());

    std::vector<double> draws(docs.size());
    std::vector<bool> is_val(docs.size());
    for (size_t i = 0; i < docs.size(); ++i) {
        draws[i] = split_draw(o.seed, docs[i]);
        is_val[i] = draws[i] < o.val_fraction;
    }
    if (std::none_of(is_val.begin(), is_val.end(), [](bool v) { return v; }))
        is_val[std::min_element(draws.begin(), draws.end()) - draws.begin()] = true;
    if (std::all_of(is_val.begin(), is_val.end(), [](bool v) { return v; }))
        is_val[std::max_element(draws.begin(), draws.end()) - draws.begin()] = false;

    Split train, val;
    CorpusStats stats;
    stats.files = static_cast<int64_t>(files.size());
    for (size_t i = 0; i < docs.size(); ++i) {
        Split& s = is_val[i] ? val : train;
        auto ids = tokenizer.encode(docs[i]);
        ids.push_back(tokenizer.eot_id());
        s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
        s.lengths.push_back(static_cast<int64_t>(ids.size()));
        s.tagged.push_back(0);
    }
    // Long documents go to train: a long source is a handful of documents, and one drawn into val would take a large
    // share of the long tokens from training.
    for (const auto& path : o.long_docs) {
        auto ids = tokenizer.encode(corpus_read_tree(path));
        ids.push_back(tokenizer.eot_id());
        train.tokens.insert(train.tokens.end(), ids.begin(), ids.end());
        train.lengths.push_back(static_cast<int64_t>(ids.size()));
        train.tagged.push_back(1);
        ++stats.documents_long;
        stats.tokens_long += static_cast<int64_t>(ids.size());
    }
    stats.documents_train = static_cast<int64_t>(train.lengths.size());
    stats.documents_val = static_cast<int64_t>(val.lengths.size());
    stats.tokens_train = static_cast<int64_t>(train.tokens.size());
    stats.tokens_val = static_cast<int64_t>(val.tokens.size());
    stats.entropy_nats = corpus_unigram_entropy(train.tokens, tokenizer.vocab_size());
    stats.entropy_bits = stats.entropy_nats / std::log(2.0);

    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec) core::fail(ExitCode::data, "cannot create output directory: {} [{}]", ec.message(), o.out_dir);
    write_split(o, "train", train, tokenizer.vocab_size());
    write_split(o, "val", val, tokenizer.vocab_size());

    nlohmann::ordered_json j;
    j["format"] = o.format;
    j["tokenizer"] = tokenizer.name();
    j["vocab_size"] = tokenizer.vocab_size();
    j["eot_id"] = tokenizer.eot_id();
    j["seed"] = o.seed;
    j["val_fraction"] = o.val_fraction;
    j["files"] = files;
    j["documents"] = {{"train", stats.documents_train}, {"val", stats.documents_val}};
    j["long_documents"] = o.long_docs;
    j["long"] = {{"documents", stats.documents_long}, {"tokens", stats.tokens_long}};
    j["tokens"] = {{"train", stats.tokens_train}, {"val", stats.tokens_val}};
    j["unigram_entropy_nats"] = stats.entropy_nats;
    j["unigram_entropy_bits"] = stats.entropy_bits;
    core::write_file_atomic((fs::path(o.out_dir) / "stats.json").string(), j.dump(2) + "\n", core::ExitCode::data);
    return stats;
}

int64_t corpus_write_text(const std::vector<std::string>& inputs, const std::string& path) {
    const auto files = corpus_list_files(inputs);
    core::AtomicFileWriter out(path, core::ExitCode::data);
    int64_t n = 0;
    for (const auto& f : files) {
        for (const auto& doc : corpus_read_documents(f)) {
            out.write(doc);
            if (doc.back() != '\n') out.write("\n");
            ++n;
        }
    }
    out.commit();
    return n;
}

}  // namespace mt::data
