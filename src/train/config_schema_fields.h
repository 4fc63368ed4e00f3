// The helpers that build schema rows (train/config_schema.h): one per kind of key, each with its range or choices.
// Shared by the files that declare rows (config_schema.cpp, config_schema_muon.cpp). Internal to src/train.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "nn/enum_names.h"
#include "train/config_schema.h"

namespace mt::train::schema {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline Field integer(std::string key, int64_t* p, double lo, double hi, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help), .min = lo, .max = hi};
}

// A number in [lo, hi].
inline Field number(std::string key, double* p, double lo, double hi, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help), .min = lo, .max = hi};
}

// A number in (lo, hi].
inline Field number_above(std::string key, double* p, double lo, double hi, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help), .min = lo, .max = hi, .min_exclusive = true};
}

// A number in [lo, hi).
inline Field number_below(std::string key, double* p, double lo, double hi, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help), .min = lo, .max = hi, .max_exclusive = true};
}

inline Field flag(std::string key, bool* p, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help)};
}

// A string: any, or one of `choices`.
inline Field text(std::string key, std::string* p, std::string help, std::vector<std::string> choices = {}) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help), .choices = std::move(choices)};
}

inline Field list(std::string key, std::vector<std::string>* p, std::string help) {
    return {.key = std::move(key), .ptr = p, .help = std::move(help)};
}

// An enum, spelled as nn::EnumNames<E> says.
template <typename E>
inline Field choice(std::string key, E* p, std::string help) {
    using Names = nn::EnumNames<E>;
    EnumField f{.get =
                    [p] {
                        size_t i = 0;
                        while (Names::names[i].first != *p) ++i;
                        return i;
                    },
                .set = [p](size_t i) { *p = Names::names[i].first; }};
    std::vector<std::string> choices;
    for (const auto& [value, name] : Names::names) choices.push_back(name);
    return {.key = std::move(key), .ptr = std::move(f), .help = std::move(help), .choices = std::move(choices)};
}

// An array of enum values, each spelled as nn::EnumNames<E> says.
template <typename E>
inline Field choice_list(std::string key, std::vector<E>* p, std::string help) {
    using Names = nn::EnumNames<E>;
    EnumListField f{.get =
                        [p] {
                            std::vector<size_t> out;
                            for (E v : *p) {
                                size_t i = 0;
                                while (Names::names[i].first != v) ++i;
                                out.push_back(i);
                            }
                            return out;
                        },
                    .set =
                        [p](const std::vector<size_t>& idx) {
                            p->clear();
                            for (size_t i : idx) p->push_back(Names::names[i].first);
                        }};
    std::vector<std::string> choices;
    for (const auto& [value, name] : Names::names) choices.push_back(name);
    return {.key = std::move(key), .ptr = std::move(f), .help = std::move(help), .choices = std::move(choices)};
}

}  // namespace mt::train::schema
