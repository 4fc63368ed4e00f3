// Metrics: the JSONL log (conventions §7.1), one line per record, non-finite values as null and listed under
// "nonfinite". Only rank 0 writes. Each line goes to the file whole or not at all: a write that fails part-way (a
// full disk) is cut back to the last complete line and ends the run with exit 9, and a torn last line left by a
// process killed mid-write is cut off when the log is opened again, so the next line never glues onto it.
// `train` and `eval` lines also go to the file views: TensorBoard event files and Prometheus's metrics.prom.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

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

   private:
    void write_jsonl(int64_t step, double time, const std::string& kind, const nlohmann::json& fields);
    int fd_ = -1;
    std::string path_;
    std::unique_ptr<TensorBoardWriter> tensorboard_;
    std::unique_ptr<PrometheusFile> prometheus_;
};

// Unix time in seconds.
double unix_seconds();

}  // namespace mt::train
