// Reading what a test's run wrote: a whole file's bytes (to compare checkpoint files bit for bit), the event lines
// of a metrics.jsonl with a given name (bad steps, alarms, checkpoints), and the metric keys of its train and eval
// lines.
#pragma once

#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
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

// The metric keys of the metrics.jsonl at `path`, by line kind ("train", "eval"), without step, time and kind.
inline std::map<std::string, std::set<std::string>> metrics_keys(const std::string& path) {
    std::map<std::string, std::set<std::string>> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line);
        const std::string kind = j.at("kind");
        if (kind != "train" && kind != "eval") continue;
        for (const auto& [k, v] : j.items())
            if (k != "step" && k != "time" && k != "kind") out[kind].insert(k);
    }
    return out;
}

}  // namespace mt::testing
