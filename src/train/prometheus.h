// Prometheus text exposition 0.0.4 (conventions §7.2) of the metrics: a view of the JSONL log, written atomically to
// `<run.dir>/metrics.prom` for node_exporter's textfile collector. The key-to-name mapping is in docs/operations.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mt::train {

struct PrometheusOptions {
    std::string job;          // the `job` label of every sample (run.name)
    bool per_expert = false;  // array values (moe/load/lNN) as one sample per expert, `expert` label
};

// One JSONL line as the views see it (fields before the NaN -> null of the JSONL).
struct MetricsLine {
    std::string kind;  // "train" or "eval"
    int64_t step = 0;
    nlohmann::json fields;
};

// Counts of the log's `event` lines that Prometheus sees as counters (docs/operations.md): alarms by kind and the
// supervisor's restarts.
struct MetricsEventCounts {
    std::map<std::string, int64_t> alarms;  // moetrain_alarms_total{kind="<kind>"}
    int64_t restarts = 0;                   // moetrain_restarts_total
};

// Where a metric path goes: the family name and the labels after `job` ("moe/max_vio/l03" ->
// moetrain_moe_max_vio, {layer: 3}).
struct PrometheusSeries {
    std::string family;
    std::vector<std::pair<std::string, std::string>> labels;
};
PrometheusSeries prometheus_series(const std::string& path);

// The exposition of the lines' metrics, families in name order, each with # HELP and # TYPE before its samples;
// a line's step is moetrain_steps_total (train) or moetrain_eval_step (eval). No timestamps: the textfile collector
// refuses them. `events`, when given, adds the event counters (the HTTP endpoint's /metrics, which sees event lines).
std::string prometheus_exposition(const std::vector<MetricsLine>& lines,
                                  const PrometheusOptions& options,
                                  const MetricsEventCounts* events = nullptr);

// Escaping of a label value (backslash, double quote, newline) and of HELP text (backslash, newline).
std::string prometheus_escape_label(const std::string& value);
std::string prometheus_escape_help(const std::string& text);

// Keeps the latest train and eval line and rewrites the file (temp + rename) from them at each update, so that a
// scrape never reads half a file.
class PrometheusFile {
   public:
    PrometheusFile(std::string path, PrometheusOptions options);
    // A failed write is exit 9 naming the file.
    void update(const MetricsLine& line);

   private:
    std::string path_;
    PrometheusOptions options_;
    std::map<std::string, MetricsLine> latest_;  // by kind
};

}  // namespace mt::train
