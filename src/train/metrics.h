// Metrics: the JSONL log (conventions §7.1), one line per record, non-finite values as null and listed under
// "nonfinite". Only rank 0 writes. Each line goes to the file whole or not at all: a write that fails part-way (a
// full disk) is cut back to the last complete line and ends the run with exit 9, and a torn last line left by a
// process killed mid-write is cut off when the log is opened again, so the next line never glues onto it.
// `train` and `eval` lines also go to the file views: TensorBoard event files and Prometheus's metrics.prom; every
// line also goes to the sinks added (the HTTP endpoint's in-memory ring), so the log knows nothing of their readers.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mt::train {

class TensorBoardWriter;
class PrometheusFile;

// The views written beside the JSONL (docs/operations.md); empty paths are views turned off.
struct MetricsViews {
    std::string tensorboard_dir;  // <run.dir>/tb
    std::string prometheus_path;  // <run.dir>/metrics.prom
    std::string job;              // the Prometheus `job` label (run.name)
    bool prometheus_per_expert = false;
};

// The name both views give a JSONL key: the key itself when it has a namespace ("moe/max_vio/l03"), else the line's
// kind in front ("train/loss"), with the eval line's "val_" dropped ("val_loss" -> "eval/loss").
std::string metric_path(const std::string& kind, const std::string& key);

// A reader of every line the log writes, called on the training thread after the line is in the JSONL: it must be
// quick (no I/O, a short lock at most) and must not throw.
class MetricsSink {
   public:
    virtual ~MetricsSink() = default;
    // fields: the line's keys besides step, time and kind, before the JSONL's NaN -> null.
    virtual void on_line(int64_t step, double time, const std::string& kind, const nlohmann::json& fields) = 0;
};

class MetricsLog {
   public:
    MetricsLog() = default;
    // Opens path for appending (a resumed run continues the same file), first cutting a last line that has no
    // '\n' (with a warning on stdout). Empty path: records are dropped. An unopenable file is exit 9.
    // The views are opened here too (a TensorBoard file is created at once).
    explicit MetricsLog(const std::string& path, const MetricsViews& views = {});
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    // Writes {"step", "time", "kind", ...fields}; numbers that are NaN or infinite become null. An I/O failure
    // leaves the file at its last complete line and throws Error(ExitCode::io) naming the file. A `train` or `eval`
    // line also goes to the views, with the same time.
    void write(int64_t step, const std::string& kind, const nlohmann::json& fields);

    // Lines written from now on also go to `sink`, with the same time as the JSONL line.
    void add_sink(std::shared_ptr<MetricsSink> sink);

   private:
    void write_jsonl(int64_t step, double time, const std::string& kind, const nlohmann::json& fields);
    int fd_ = -1;
    std::string path_;
    std::unique_ptr<TensorBoardWriter> tensorboard_;
    std::unique_ptr<PrometheusFile> prometheus_;
    std::vector<std::shared_ptr<MetricsSink>> sinks_;
};

// Unix time in seconds.
double unix_seconds();

}  // namespace mt::train
