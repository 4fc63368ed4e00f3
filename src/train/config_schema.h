// The job config's schema: one row per key (the dotted key, the field it fills, its range or allowed values, a help
// line), in the order of docs/configs.md. The parser reads it (train/config.cpp), and so do the resolved TOML and the
// reference page that `moetrain config --docs` prints (train/config_docs.cpp). Internal to src/train.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "train/config.h"

namespace mt::train {

// An enum-valued key, read and written as the index of its value in the row's choices (the enum's spelling table,
// nn/enum_names.h, in order).
struct EnumField {
    std::function<size_t()> get;
    std::function<void(size_t)> set;
};

// An array of enum values (recompute.modules), read and written as their indices in the row's choices.
struct EnumListField {
    std::function<std::vector<size_t>()> get;
    std::function<void(const std::vector<size_t>&)> set;
};

// An integer key may also take words (recompute.every = "sqrt"): the row's choices, word i stored as -i, so the
// integer range must exclude 0 and below.
// An array of integers (attn.window_layers) checks each element against the row's range.
using FieldPtr = std::variant<int64_t*,
                              double*,
                              bool*,
                              std::string*,
                              std::vector<std::string>*,
                              std::vector<int64_t>*,
                              EnumField,
                              EnumListField>;

struct Field {
    std::string key;  // "section.name" or "section.table.name"
    FieldPtr ptr;
    std::string help;  // one line of Markdown for docs/configs.md
    double min = -std::numeric_limits<double>::infinity();
    double max = std::numeric_limits<double>::infinity();
    bool min_exclusive = false;
    bool max_exclusive = false;
    std::vector<std::string> choices = {};  // the allowed values of a string or enum key (empty: any string)
};

// The rows, pointing into c.
std::vector<Field> config_schema(JobConfig& c);
// The [muon] rows (config_schema_muon.cpp), which config_schema appends.
std::vector<Field> config_schema_muon(JobConfig& c);
// The [vision] and [projector] rows (config_schema_vision.cpp), which config_schema appends.
std::vector<Field> config_schema_vision(JobConfig& c);
// The loss weighting's rows (loss.weighting and its constants, config_schema_vision.cpp), which config_schema puts
// after loss.chunk_tokens.
std::vector<Field> config_schema_loss(JobConfig& c);
// The layouts and keys image + text training refuses yet (exit 2 naming the key).
void config_vision_validate(const JobConfig& c, const std::string& src);
// Fills what image-text data on disk implies when left unset: vision.image_token = the tokenizer's vocab + 2, the
// <img_pad> of data/image_text_rows.h.
void config_vision_defaults(JobConfig& c);

// A key that older versions read, with what replaces it: a config that still sets one fails naming both.
struct RemovedKey {
    const char* key;
    const char* replacement;  // what to write instead, as TOML
    const char* hint;         // how the old values map to the new
};

const std::vector<RemovedKey>& config_removed_keys();

}  // namespace mt::train
