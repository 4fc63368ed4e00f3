// MetricsRing: the recent lines of the metrics log in memory, which the HTTP endpoint answers from
// (docs/operations.md). It is a sink of the training's MetricsLog, or is filled from a metrics.jsonl (the history of a
// resumed run, `moetrain dashboard`). Bounded: the newest `line_capacity` train/eval lines and `event_capacity` event
// lines; the event counters count every event seen. The writer (the training thread) takes the lock only to push a
// record built before it; readers copy shared pointers out under the lock and read the records after it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/metrics.h"
#include "train/prometheus.h"

namespace mt::train {

// One line of the metrics log.
struct MetricsRecord {
    int64_t step = 0;
    double time = 0.0;
    std::string kind;       // train | eval | event
    nlohmann::json fields;  // the other keys; a value the JSONL wrote as null and listed under "nonfinite" is NaN
};
using MetricsRecordPtr = std::shared_ptr<const MetricsRecord>;

// Whether an event line named `event` is an alarm: moetrain_alarms_total{kind} and the dashboard's banner. The kinds
// of operations.md §5, the events moetrain writes as warnings (any name ending in `_warning`), and the faults
// (data_failed, transient_fault, gave_up).
bool metrics_event_is_alarm(const std::string& event);

// Whether a metrics.jsonl line's kind is `kind`, without parsing it (the parse that follows decides: a nested object
// with a "kind" key would also match).
bool metrics_line_has_kind(std::string_view line, std::string_view kind);

// A line of metrics.jsonl as a record; nullopt for a line that is not a JSON object with step, time and kind.
std::optional<MetricsRecord> metrics_record_parse(std::string_view line);

// Calls fn with each complete ('\n'-terminated) line of the file from byte `offset` on, and returns the offset after
// the last one: a line still being written is left for the next call. A file that cannot be read is exit 3 naming
// it.
uint64_t metrics_jsonl_for_each(const std::string& path,
                                uint64_t offset,
                                const std::function<void(std::string_view line)>& fn);

class MetricsRing final : public MetricsSink {
   public:
    // A train line of a large MoE model carries hundreds of values (one of 300 takes about 30 KB in memory): 2048
    // such lines are about 60 MB, and older steps are still in the file.
    static constexpr size_t kDefaultLines = 2048;
    static constexpr size_t kDefaultEvents = 1024;
    explicit MetricsRing(size_t line_capacity = kDefaultLines, size_t event_capacity = kDefaultEvents);

    // Keeps train, eval and event lines (a copy of fields); other kinds (config) are not kept.
    void on_line(int64_t step, double time, const std::string& kind, const nlohmann::json& fields) override;

    // Adds the complete lines of a metrics.jsonl from byte `offset` on and returns the offset after them (the next
    // call's offset). Only the last line_capacity train/eval lines are parsed; every event line is counted.
    uint64_t load_jsonl(const std::string& path, uint64_t offset = 0);

    // The train and eval lines (in the order they came) whose step is at least `since`, and what the ring covers: the
    // oldest step it holds (INT64_MAX when none) and whether older lines were dropped (those are only in the file).
    struct Snapshot {
        std::vector<MetricsRecordPtr> lines;
        int64_t first_step = INT64_MAX;
        bool dropped = false;
    };
    Snapshot lines_since(int64_t since) const;
    // The event lines kept whose step is at least `since`.
    std::vector<MetricsRecordPtr> events_since(int64_t since) const;
    // The last train line and the last eval line, for the Prometheus exposition.
    std::vector<MetricsLine> latest() const;
    MetricsEventCounts event_counts() const;

   private:
    void push(MetricsRecordPtr record);  // under mutex_
    size_t line_capacity_, event_capacity_;
    mutable std::mutex mutex_;
    std::deque<MetricsRecordPtr> lines_, events_;
    MetricsRecordPtr latest_train_, latest_eval_;
    MetricsEventCounts counts_;
    bool dropped_ = false;
};

}  // namespace mt::train
