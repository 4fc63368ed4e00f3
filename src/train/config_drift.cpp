// Flattens both TOML documents to (dotted key, value text) and compares them.
#include "train/config_drift.h"

#include <toml++/toml.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "train/config.h"

namespace mt::train {

namespace {

// Keys that may change between a checkpoint and its resume without changing what is trained.
bool ignored(const std::string& key) {
    static const char* const kPrefixes[] = {"checkpoint.", "metrics.", "parallel.", "moe.alarm."};
    static const char* const kKeys[] = {"run.name",
                                        "run.dir",
                                        "run.threads",
                                        "run.device",
                                        "train.steps",
                                        "train.eval_every",
                                        "train.eval_batches",
                                        "data.val_paths",
                                        "moe.log_loads_every",
                                        "model.init_std"};  // used only before step 0
    for (const char* p : kPrefixes)
        if (key.rfind(p, 0) == 0) return true;
    return std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys);
}

void flatten(const toml::table& table, const std::string& prefix, std::map<std::string, std::string>* out) {
    for (const auto& [name, node] : table) {
        const std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
        if (const toml::table* sub = node.as_table()) {
            flatten(*sub, key, out);
            continue;
        }
        std::ostringstream text;
        node.visit([&](const auto& v) { text << v; });
        (*out)[key] = text.str();
    }
}

}  // namespace

std::vector<ConfigDrift> config_drift(const std::string& saved_toml, const std::string& current_toml) {
    std::map<std::string, std::string> saved, now;
    try {
        flatten(toml::parse(config_upgrade_saved(saved_toml)), "", &saved);
        flatten(toml::parse(current_toml), "", &now);
    } catch (const toml::parse_error& e) {
        return {{"(config_toml)", std::string(e.description()), "(not comparable)"}};
    }
    std::vector<ConfigDrift> out;
    for (const auto& [key, value] : saved) {
        if (ignored(key)) continue;
        const auto it = now.find(key);
        if (it == now.end())
            out.push_back({key, value, "(absent)"});
        else if (it->second != value)
            out.push_back({key, value, it->second});
    }
    for (const auto& [key, value] : now)
        if (!ignored(key) && !saved.count(key)) out.push_back({key, "(absent)", value});
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    return out;
}

}  // namespace mt::train
