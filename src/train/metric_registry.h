// The metric registry (operations.md §6, docs/metrics.md): every metric a job's `train` and `eval` lines can carry,
// with its type, unit and meaning, per-layer metrics expanded for the job's model (its layers, their kinds, the MoE
// layers, the pipeline stages). The JSONL lines, metrics.prom, the HTTP endpoint and TensorBoard are views of these
// keys (metric_path and prometheus_series name them there); docs/metrics.md is generated from it for
// configs/kimi_linear_mini.toml (`moetrain config --metrics`), and a test checks that a training writes exactly the
// keys its registry declares.
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace mt::train {

struct MetricDef {
    std::string key;   // the JSONL key ("loss", "moe/max_vio/l03"; "val_loss" in an eval line)
    std::string line;  // "train" or "eval"
    std::string type;  // "gauge", "counter", or "array" (per expert; Prometheus shows it with moetrain_per_expert)
    std::string unit;  // "", "s", "bytes", "tokens", "tokens/s", "FLOP/s", ...
    std::string help;
    // Written only every so many steps or under a condition (moe.log_loads_every, a curriculum, loss scaling): the
    // condition in words, for docs/metrics.md; empty: every metrics.every-th step.
    std::string when;
};

// Every metric of the job's lines, in a fixed order: the step's core figures, memory, communication, health and
// alarms, then the per-layer groups in layer order.
std::vector<MetricDef> metric_registry(const JobConfig& cfg);

// The registry as a Markdown page: the count, and one table per family (docs/metrics.md).
std::string metric_registry_markdown(const JobConfig& cfg);

}  // namespace mt::train
