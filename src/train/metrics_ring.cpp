// The metrics ring: records built outside the lock and pushed under it; metrics.jsonl read line by line, with only
// the lines the ring keeps parsed.
#include "train/metrics_ring.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "core/error.h"
#include "train/alarms.h"

namespace mt::train {

namespace {

// The trainer's alarms (operations.md §5), the supervisor's and the faults; `hang` is also a restart whose reason is a
// hang.
const std::set<std::string, std::less<>> kAlarmEvents = [] {
    std::set<std::string, std::less<>> events(kTrainerAlarmKinds.begin(), kTrainerAlarmKinds.end());
    events.insert({"hang", "restart", "transient_fault", "data_failed", "gave_up"});
    return events;
}();

// The string at fields[key], or "" when it is missing or not a string (a hand-edited file).
std::string string_field(const nlohmann::json& fields, const char* key) {
    const auto it = fields.find(key);
    return it != fields.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

// nlohmann writes `"kind":"<kind>"` with no spaces; inside a string value the quotes would be escaped.
bool metrics_line_has_kind(std::string_view line, std::string_view kind) {
    const std::string needle = fmt::format("\"kind\":\"{}\"", kind);
    return line.find(needle) != std::string_view::npos;
}

bool metrics_event_is_alarm(const std::string& event) {
    return kAlarmEvents.contains(event) || event.ends_with("_warning");
}

std::optional<MetricsRecord> metrics_record_parse(std::string_view line) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return std::nullopt;
    const auto step = j.find("step"), time = j.find("time"), kind = j.find("kind");
    if (step == j.end() || !step->is_number_integer() || time == j.end() || !time->is_number() || kind == j.end() ||
        !kind->is_string())
        return std::nullopt;
    MetricsRecord r;
    r.step = step->get<int64_t>();
    r.time = time->get<double>();
    r.kind = kind->get<std::string>();
    j.erase("step");
    j.erase("time");
    j.erase("kind");
    // The JSONL writes a non-finite number as null and names it under "nonfinite"; NaN stands for all three.
    if (const auto nonfinite = j.find("nonfinite"); nonfinite != j.end()) {
        if (nonfinite->is_array())
            for (const auto& key : *nonfinite)
                if (key.is_string() && j.contains(key.get<std::string>()))
                    j[key.get<std::string>()] = std::numeric_limits<double>::quiet_NaN();
        j.erase("nonfinite");
    }
    r.fields = std::move(j);
    return r;
}

uint64_t metrics_jsonl_for_each(const std::string& path,
                                uint64_t offset,
                                const std::function<void(std::string_view line)>& fn) {
    std::ifstream in(path, std::ios::binary);
    if (!in) core::fail(core::ExitCode::data, "cannot open the metrics log: {} [{}]", std::strerror(errno), path);
    in.seekg(static_cast<std::streamoff>(offset));
    std::string line;
    while (std::getline(in, line)) {
        if (in.eof()) break;  // no '\n' after it: the writer is still writing it
        offset += line.size() + 1;
        fn(line);
    }
    if (in.bad()) core::fail(core::ExitCode::data, "cannot read the metrics log [{}]", path);
    return offset;
}

MetricsRing::MetricsRing(size_t line_capacity, size_t event_capacity)
    : line_capacity_(std::max<size_t>(line_capacity, 1)), event_capacity_(std::max<size_t>(event_capacity, 1)) {
    // Every alarm kind is a series from the start: a counter that appears only at its first increment hides that
    // increment from rate() and increase().
    for (const std::string& kind : kAlarmEvents) counts_.alarms[kind] = 0;
}

void MetricsRing::on_line(int64_t step, double time, const std::string& kind, const nlohmann::json& fields) {
    if (kind != "train" && kind != "eval" && kind != "event") return;
    auto record = std::make_shared<const MetricsRecord>(MetricsRecord{step, time, kind, fields});
    const std::lock_guard lock(mutex_);
    push(std::move(record));
}

uint64_t MetricsRing::load_jsonl(const std::string& path, uint64_t offset) {
    // The text of the newest train/eval lines, parsed at the end: a long run's file holds far more than the ring.
    // Events are parsed as they come (they are few, and all of them count); lines and events are kept apart, so their
    // order between each other does not matter.
    std::deque<std::string> recent;
    bool dropped = false;
    const uint64_t end = metrics_jsonl_for_each(path, offset, [&](std::string_view line) {
        if (metrics_line_has_kind(line, "train") || metrics_line_has_kind(line, "eval")) {
            if (recent.size() == line_capacity_) {
                recent.pop_front();
                dropped = true;
            }
            recent.emplace_back(line);
        } else if (metrics_line_has_kind(line, "event")) {
            if (auto r = metrics_record_parse(line); r && r->kind == "event") {
                const std::lock_guard lock(mutex_);
                push(std::make_shared<const MetricsRecord>(std::move(*r)));
            }
        }
    });
    std::vector<MetricsRecordPtr> records;
    for (const std::string& text : recent)
        if (auto r = metrics_record_parse(text); r && (r->kind == "train" || r->kind == "eval"))
            records.push_back(std::make_shared<const MetricsRecord>(std::move(*r)));
    const std::lock_guard lock(mutex_);
    dropped_ = dropped_ || dropped;
    for (MetricsRecordPtr& r : records) push(std::move(r));
    return end;
}

void MetricsRing::push(MetricsRecordPtr record) {
    if (record->kind == "event") {
        const std::string event = string_field(record->fields, "event");
        if (event == "restart") {
            ++counts_.restarts;
            if (string_field(record->fields, "reason") == "hang") ++counts_.alarms["hang"];
        }
        if (metrics_event_is_alarm(event)) ++counts_.alarms[event];
        if (events_.size() == event_capacity_) events_.pop_front();
        events_.push_back(std::move(record));
        return;
    }
    (record->kind == "train" ? latest_train_ : latest_eval_) = record;
    if (lines_.size() == line_capacity_) {
        lines_.pop_front();
        dropped_ = true;
    }
    lines_.push_back(std::move(record));
}

MetricsRing::Snapshot MetricsRing::lines_since(int64_t since) const {
    const std::lock_guard lock(mutex_);
    Snapshot out;
    out.dropped = dropped_;
    for (const MetricsRecordPtr& r : lines_) {
        out.first_step = std::min(out.first_step, r->step);
        if (r->step >= since) out.lines.push_back(r);
    }
    return out;
}

std::vector<MetricsRecordPtr> MetricsRing::events_since(int64_t since) const {
    const std::lock_guard lock(mutex_);
    std::vector<MetricsRecordPtr> out;
    for (const MetricsRecordPtr& r : events_)
        if (r->step >= since) out.push_back(r);
    return out;
}

std::vector<MetricsLine> MetricsRing::latest() const {
    MetricsRecordPtr train, eval;
    {
        const std::lock_guard lock(mutex_);
        train = latest_train_;
        eval = latest_eval_;
    }
    std::vector<MetricsLine> out;
    for (const MetricsRecordPtr& r : {train, eval})
        if (r) out.push_back({.kind = r->kind, .step = r->step, .fields = r->fields});
    return out;
}

MetricsEventCounts MetricsRing::event_counts() const {
    const std::lock_guard lock(mutex_);
    return counts_;
}

}  // namespace mt::train
