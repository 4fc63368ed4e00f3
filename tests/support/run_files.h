// Reading what a test's run wrote: a whole file's bytes (to compare checkpoint files bit for bit) and the event lines
// of a metrics.jsonl with a given name (bad steps, alarms, checkpoints).
#pragma once

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::testing {

// The file's bytes ("" when it cannot be read).
inline std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The `event` lines of the metrics.jsonl at `path` whose event is `name`, in file order.
inline std::vector<nlohmann::json> metrics_events(const std::string& path, const std::string& name) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        if (j.at("kind") == "event" && j.at("event") == name) out.push_back(j);
    }
    return out;
}

}  // namespace mt::testing
