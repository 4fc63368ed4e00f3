// Prometheus exposition: metric paths mapped to families and labels, values and escapes per the 0.0.4 text format.
#include "train/prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "core/file_util.h"
#include "train/metrics.h"

namespace mt::train {

namespace {

// The help of the families users look at first; the others name their JSONL key.
const std::map<std::string, std::string, std::less<>> kHelp = {
    {"moetrain_train_loss", "Training loss (token mean) at the last logged step."},
    {"moetrain_train_lr", "Learning rate at the last logged step."},
    {"moetrain_train_grad_norm", "Global gradient norm at the last logged step."},
    {"moetrain_train_tokens_per_s", "Training tokens per second, mean over this process's steps after the first."},
    {"moetrain_train_step_seconds", "Wall time of the last logged step in seconds."},
    {"moetrain_tokens_total", "Tokens trained on since the start of the run."},
    {"moetrain_steps_total", "Optimizer steps done since the start of the run."},
    {"moetrain_eval_loss", "Validation loss at the last evaluation."},
    {"moetrain_eval_step", "Step of the last evaluation."},
    {"moetrain_alarms_total", "Alarms raised since the start of the run, by kind (docs/operations.md \"Alarms\")."},
    {"moetrain_restarts_total", "Restarts of the job by moetrain supervise (restart event lines in metrics.jsonl)."},
};

// Renames where the mechanical name would hide a counter: cumulative values end in _total (conventions §7.2).
const std::map<std::string, std::string, std::less<>> kRenames = {
    {"moetrain_train_tokens_seen", "moetrain_tokens_total"},
    {"moetrain_train_steps_total", "moetrain_steps_total"},
};

// "l03" (a layer, letter 'l') or "s1" (a pipeline stage, letter 's').
bool is_indexed_segment(std::string_view s, char letter) {
    if (s.size() < 2 || s[0] != letter) return false;
    for (const char c : s.substr(1))
        if (c < '0' || c > '9') return false;
    return true;
}

// A number as 0.0.4 spells it; integers stay exact (tokens_total passes 2^53 only after years).
std::string format_value(const nlohmann::json& v) {
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    if (v.is_number_unsigned()) return fmt::format("{}", v.get<uint64_t>());
    if (v.is_number_integer()) return fmt::format("{}", v.get<int64_t>());
    const double d = v.get<double>();
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
    return fmt::format("{}", d);
}

// Backslash and newline always; the double quote inside label values only (HELP text keeps it).
std::string escape(const std::string& s, bool quote) {
    std::string out;
    for (const char c : s) {
        if (c == '\\' || c == '\n' || (quote && c == '"')) out += '\\';
        out += c == '\n' ? 'n' : c;
    }
    return out;
}

struct Family {
    std::string help;
    std::vector<std::string> samples;  // whole lines
};

// The JSONL key of a family's help, with the segments that became labels as placeholders (comm/<group>/bytes,
// moe/max_vio/l<NN>): one family holds every group and layer.
std::string key_pattern(const std::string& key) {
    const size_t first = key.find('/'), last = key.rfind('/');
    std::string out = key;
    if (last != std::string::npos && is_indexed_segment(std::string_view(key).substr(last + 1), 'l'))
        out = key.substr(0, last) + "/l<NN>";
    if (out.starts_with("moe/modality/") && std::count(out.begin(), out.end(), '/') == 4)
        out = "moe/modality/<modality>" + out.substr(out.find('/', 13));
    else if (key.starts_with("comm/") && first != last && key.find('/', first + 1) == last)
        out = "comm/<group>" + key.substr(last);
    else if (key.starts_with("pp/") && first != last && is_indexed_segment(std::string_view(key).substr(last + 1), 's'))
        out = key.substr(0, last) + "/s<k>";
    return out;
}

class Exposition {
   public:
    explicit Exposition(const PrometheusOptions& options) : options_(options) {}

    // with_events: the event lines' counters come too (add_events), and they count every alarm, the supervisor's
    // included, so the train line's own alarms/<kind> counts are left out of the family.
    void add_line(const MetricsLine& line, bool with_events) {
        const bool train = line.kind == "train";
        add(train ? "train/steps_total" : "eval/step", "", line.kind, line.step);
        for (const auto& [key, value] : line.fields.items()) {
            if (with_events && key.starts_with("alarms/")) continue;
            if (value.is_number() || value.is_boolean()) {
                add(metric_path(line.kind, key), key, line.kind, value);
            } else if (value.is_array() && options_.per_expert) {
                for (size_t e = 0; e < value.size(); ++e)
                    if (value[e].is_number()) add(metric_path(line.kind, key), key, line.kind, value[e], e);
            }
        }
    }

    void add_events(const MetricsEventCounts& events) {
        for (const auto& [kind, count] : events.alarms)
            add_sample("moetrain_alarms_total", {{"kind", kind}}, fmt::format("{}", count), "");
        add_sample("moetrain_restarts_total", {}, fmt::format("{}", events.restarts), "");
    }

    std::string text() const {
        std::string out;
        for (const auto& [name, family] : families_) {
            out += fmt::format("# HELP {} {}\n", name, prometheus_escape_help(family.help));
            out += fmt::format("# TYPE {} {}\n", name, name.ends_with("_total") ? "counter" : "gauge");
            for (const std::string& sample : family.samples) out += sample;
        }
        return out;
    }

   private:
    void add(const std::string& path,
             const std::string& key,
             const std::string& kind,
             const nlohmann::json& value,
             size_t expert = SIZE_MAX) {
        PrometheusSeries series = prometheus_series(path);
        if (expert != SIZE_MAX) series.labels.emplace_back("expert", std::to_string(expert));
        add_sample(series.family,
                   series.labels,
                   format_value(value),
                   fmt::format("metrics.jsonl `{}` lines, key {}.", kind, key_pattern(key)));
    }

    // fallback_help: the HELP text of a family that kHelp does not name.
    void add_sample(const std::string& name,
                    const std::vector<std::pair<std::string, std::string>>& extra_labels,
                    const std::string& value,
                    const std::string& fallback_help) {
        std::string labels = fmt::format("job=\"{}\"", prometheus_escape_label(options_.job));
        for (const auto& [label, v] : extra_labels)
            labels += fmt::format(",{}=\"{}\"", label, prometheus_escape_label(v));
        Family& family = families_[name];
        if (family.help.empty()) {
            const auto help = kHelp.find(name);
            family.help = help != kHelp.end() ? help->second : fallback_help;
        }
        family.samples.push_back(fmt::format("{}{{{}}} {}\n", name, labels, value));
    }

    const PrometheusOptions& options_;
    std::map<std::string, Family> families_;
};

}  // namespace

PrometheusSeries prometheus_series(const std::string& path) {
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
        const size_t slash = path.find('/', start);
        parts.push_back(path.substr(start, slash - start));
        if (slash == std::string::npos) break;
        start = slash + 1;
    }
    PrometheusSeries out;
    // comm/<group>/<stat>: one family per statistic, the mesh group as a label.
    if (parts.size() == 3 && parts[0] == "comm") {
        out.labels.emplace_back("group", parts[1]);
        parts.erase(parts.begin() + 1);
    }
    // alarms/<kind>: every alarm kind's count in one counter family, the kind as a label.
    if (parts.size() == 2 && parts[0] == "alarms") {
        out.family = "moetrain_alarms_total";
        out.labels.emplace_back("kind", parts[1]);
        return out;
    }
    // A trailing layer (moe/<stat>/l<NN>) or, under pp/, pipeline stage (pp/<stat>/s<k>) index becomes a label.
    const bool stage = parts.size() == 3 && parts[0] == "pp" && is_indexed_segment(parts.back(), 's');
    if (stage || (parts.size() > 1 && is_indexed_segment(parts.back(), 'l'))) {
        out.labels.emplace_back(stage ? "stage" : "layer",
                                std::to_string(std::strtoll(parts.back().c_str() + 1, nullptr, 10)));
        parts.pop_back();
    }
    // moe/modality/<modality>/<stat>/l<NN> (multimodal.md §4): one family per statistic, the modality as a label.
    if (parts.size() == 4 && parts[0] == "moe" && parts[1] == "modality") {
        out.labels.emplace_back("modality", parts[2]);
        parts.erase(parts.begin() + 2);
    }
    out.family = "moetrain";
    for (const std::string& part : parts) {
        out.family += '_';
        for (const char c : part)
            out.family += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ? c : '_';
    }
    if (const auto it = kRenames.find(out.family); it != kRenames.end()) out.family = it->second;
    return out;
}

std::string prometheus_exposition(const std::vector<MetricsLine>& lines,
                                  const PrometheusOptions& options,
                                  const MetricsEventCounts* events) {
    Exposition exposition(options);
    for (const MetricsLine& line : lines) exposition.add_line(line, events != nullptr);
    if (events != nullptr) exposition.add_events(*events);
    return exposition.text();
}

std::string prometheus_escape_label(const std::string& value) {
    return escape(value, /*quote=*/true);
}

std::string prometheus_escape_help(const std::string& text) {
    return escape(text, /*quote=*/false);
}

PrometheusFile::PrometheusFile(std::string path, PrometheusOptions options)
    : path_(std::move(path)), options_(std::move(options)) {}

void PrometheusFile::update(const MetricsLine& line) {
    latest_[line.kind] = line;
    std::vector<MetricsLine> lines;
    for (const auto& [kind, l] : latest_) lines.push_back(l);
    core::write_file_atomic(path_, prometheus_exposition(lines, options_), core::ExitCode::io);
}

}  // namespace mt::train
