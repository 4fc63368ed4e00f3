// The TOML spelling of each enum-valued config setting (kda.gate, moe.score, attnres.mode, ...): one table per
// enum, the only place that spells its values. The config parser takes the choices, the parse and the resolved TOML
// from it (train/config_schema.cpp); messages, checkpoint JSON and tests name a value through enum_name.
#pragma once

#include <array>
#include <utility>

namespace mt::nn {

// Specialised beside each enum: `static constexpr std::array<std::pair<E, const char*>, N> names`, every value
// once, in the order the docs list the choices.
template <typename E>
struct EnumNames;

// The TOML spelling of `value`.
template <typename E>
const char* enum_name(E value) {
    for (const auto& [v, name] : EnumNames<E>::names)
        if (v == value) return name;
    return "?";
}

}  // namespace mt::nn
