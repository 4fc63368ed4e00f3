// Corpus preparation for `moetrain data`: read text or fortune files, split documents, assign each to train or
// val, tokenize with EOT after every document, write token files and stats.json.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

// Expands the inputs: a file is taken as is; a directory contributes every regular file directly inside it,
// sorted by name, skipping hidden files and names ending in .dat or .u8 (fortune index files and links).
// Missing inputs throw Error(ExitCode::data) naming the path.
std::vector<std::string> corpus_list_files(const std::vector<std::string>& inputs);

// Documents of one file. A file with a line holding just "%" is a fortune file: its entries (the text between
// such lines) are the documents. Any other file is one document. Documents that are empty or only whitespace
// are dropped.
std::vector<std::string> corpus_read_documents(const std::string& path);

// Unigram entropy -sum p log p (nats) of the token frequencies.
double corpus_unigram_entropy(std::span<const int32_t> tokens, int64_t vocab_size);

// One long document from a file or a directory tree (`moetrain data --long-doc`): a directory's regular files at any
// depth, in sorted path order, concatenated with a newline after each. Symbolic links (common-licenses' GPL ->
// GPL-3), hidden names, compressed files (.gz, .xz, .bz2, .zst) and files holding a NUL byte (binary) are skipped.
// A missing path, or one without any text file, is exit 3 naming it.
std::string corpus_read_tree(const std::string& path);

struct CorpusOptions {
    std::vector<std::string> inputs;     // files or directories
    std::vector<std::string> long_docs;  // each one long document tagged long (corpus_read_tree); always in train
    std::string out_dir;
    std::string format = "llmc";  // "llmc": train.bin, val.bin; "megatron": train.{bin,idx}, val.{bin,idx}
    double val_fraction = 0.05;
    uint64_t seed = 1234;
};

struct CorpusStats {
    int64_t files = 0;
    int64_t documents_train = 0;
    int64_t documents_val = 0;
    int64_t tokens_train = 0;
    int64_t tokens_val = 0;
    int64_t documents_long = 0;  // from long_docs (all in train)
    int64_t tokens_long = 0;
    double entropy_nats = 0.0;  // unigram entropy of the train tokens (EOT included)
    double entropy_bits = 0.0;
};

// Prepares a corpus. A document goes to val when a Philox draw keyed by (seed, hash of its text) is below
// val_fraction, so the split does not depend on file order and duplicate documents share a split; val and
// train are each made non-empty by moving the document with the extreme draw. Writes the token files and
// OUT_DIR/stats.json atomically. Needs at least two documents.
// @param[in] options    inputs, output directory, format, split
// @param[in] tokenizer  encodes each document; its eot_id() follows every document
CorpusStats corpus_prepare(const CorpusOptions& options, const Tokenizer& tokenizer);

// Writes every document of the inputs to one text file (documents separated by a newline), the training input
// for tokenizer_train_sentencepiece. Returns the number of documents.
int64_t corpus_write_text(const std::vector<std::string>& inputs, const std::string& path);

}  // namespace mt::data
