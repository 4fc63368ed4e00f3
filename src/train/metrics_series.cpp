// /api/series and /api/events: the matching series gathered from the file's older lines and the ring's, thinned,
// as JSON.
#include "train/metrics_series.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <mutex>
#include <set>

#include "core/error.h"

namespace mt::train {

namespace {

constexpr size_t kMaxNameLength = 128;

// One scan of metrics.jsonl at a time: a burst of page loads costs the training one core at most.
std::mutex g_file_scan;

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    for (size_t start = 0;;) {
        const size_t end = s.find(sep, start);
        out.push_back(s.substr(start, end - start));
        if (end == std::string::npos) return out;
        start = end + 1;
    }
}

int64_t parse_integer(const std::string& text, const char* parameter) {
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size())
        core::fail(core::ExitCode::usage, "{}: '{}' is not an integer", parameter, text);
    return value;
}

// The top-level step of a dumped line without parsing it (the key `"step":` is the only one spelled so: other keys
// ending in step, like "resumed_step", have '_' before it).
std::optional<int64_t> line_step(std::string_view line) {
    constexpr std::string_view key = "\"step\":";
    const size_t at = line.find(key);
    if (at == std::string_view::npos) return std::nullopt;
    int64_t step = 0;
    const char* begin = line.data() + at + key.size();
    if (std::from_chars(begin, line.data() + line.size(), step).ec != std::errc()) return std::nullopt;
    return step;
}

struct Series {
    std::vector<int64_t> steps;
    nlohmann::json values = nlohmann::json::array();
};

// Gathers the points of the series that match the query, record by record in log order.
class SeriesBuilder {
   public:
    explicit SeriesBuilder(const SeriesQuery& query) : query_(query) {}

    void add(const MetricsRecord& r) {
        if (r.step < query_.since) return;
        last_step_ = std::max(last_step_, r.step);
        for (const auto& [key, value] : r.fields.items()) {
            if (!value.is_number() && !value.is_boolean() && !value.is_array()) continue;
            Series* series = find(metric_path(r.kind, key));
            if (series == nullptr) continue;
            // A restarted job logs the steps after its checkpoint again: the later values replace the earlier.
            while (!series->steps.empty() && series->steps.back() >= r.step) {
                series->steps.pop_back();
                series->values.erase(series->values.size() - 1);
            }
            series->steps.push_back(r.step);
            series->values.push_back(value.is_boolean() ? nlohmann::json(value.get<bool>() ? 1 : 0) : value);
        }
    }

    nlohmann::json to_json() {
        nlohmann::json out = {{"since", query_.since}, {"series", nlohmann::json::object()}};
        out["last_step"] = last_step_ >= query_.since ? nlohmann::json(last_step_) : nlohmann::json(nullptr);
        for (auto& [path, series] : series_) {
            thin(series);
            out["series"][path] = {{"steps", series.steps}, {"values", std::move(series.values)}};
        }
        return out;
    }

   private:
    Series* find(const std::string& path) {
        if (const auto it = series_.find(path); it != series_.end()) return &it->second;
        if (rejected_.contains(path)) return nullptr;
        const bool match = std::any_of(query_.names.begin(), query_.names.end(), [&](const std::string& pattern) {
            return metric_path_matches(pattern, path);
        });
        if (!match || series_.size() >= kSeriesMaxMatches) {
            rejected_.insert(path);
            return nullptr;
        }
        return &series_[path];
    }

    // Every k-th point and the last, so that at most max_points (m) remain: the points 0, k, 2k, ... number
    // floor((n - 1) / k) + 1 <= m - 1 with k = ceil((n - 1) / (m - 2)), and the last is one more.
    void thin(Series& s) const {
        const size_t n = s.steps.size(), m = query_.max_points;
        if (n <= m) return;
        const size_t stride = m > 2 ? (n - 1 + m - 3) / (m - 2) : n;
        Series kept;
        for (size_t i = 0; i < n; ++i) {
            if (i % stride != 0 && i + 1 != n) continue;
            kept.steps.push_back(s.steps[i]);
            kept.values.push_back(std::move(s.values[i]));
        }
        s = std::move(kept);
    }

    const SeriesQuery& query_;
    std::map<std::string, Series> series_;
    std::set<std::string> rejected_;
    int64_t last_step_ = INT64_MIN;
};

}  // namespace

SeriesQuery series_query_parse(const std::string& names, const std::string& since, const std::string& points) {
    SeriesQuery q;
    if (names.empty()) core::fail(core::ExitCode::usage, "names: give one or more metric paths, e.g. names=train/loss");
    for (const std::string& name : split(names, ',')) {
        const bool ok =
            !name.empty() && name.size() <= kMaxNameLength && std::all_of(name.begin(), name.end(), [](char c) {
                return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                       c == '/' || c == '*' || c == '.' || c == '-';
            });
        if (!ok)
            core::fail(core::ExitCode::usage,
                       "names: '{}' is not a metric path (1 to {} characters of letters, digits, _ / * . -)",
                       name.substr(0, kMaxNameLength),
                       kMaxNameLength);
        q.names.push_back(name);
    }
    if (q.names.size() > kSeriesMaxNames)
        core::fail(core::ExitCode::usage, "names: {} names, at most {}", q.names.size(), kSeriesMaxNames);
    q.since = series_since_parse(since);
    if (!points.empty()) {
        const int64_t n = parse_integer(points, "points");
        if (n < 2 || n > static_cast<int64_t>(kSeriesMaxPoints))
            core::fail(core::ExitCode::usage, "points: {} is outside [2, {}]", n, kSeriesMaxPoints);
        q.max_points = static_cast<size_t>(n);
    }
    return q;
}

int64_t series_since_parse(const std::string& since) {
    return since.empty() ? 0 : parse_integer(since, "since");
}

bool metric_path_matches(const std::string& pattern, const std::string& path) {
    size_t p = 0, s = 0;
    for (;;) {
        const size_t p_end = std::min(pattern.find('/', p), pattern.size());
        const size_t s_end = std::min(path.find('/', s), path.size());
        const std::string_view want(pattern.data() + p, p_end - p), got(path.data() + s, s_end - s);
        if (want != "*" && want != got) return false;
        const bool pattern_done = p_end == pattern.size(), path_done = s_end == path.size();
        if (pattern_done || path_done) return pattern_done && path_done;
        p = p_end + 1;
        s = s_end + 1;
    }
}

nlohmann::json metrics_series(const MetricsRing& ring, const std::string& jsonl_path, const SeriesQuery& query) {
    SeriesBuilder builder(query);
    const MetricsRing::Snapshot held = ring.lines_since(query.since);
    if (!jsonl_path.empty() && held.dropped && query.since < held.first_step) {
        const std::lock_guard lock(g_file_scan);
        try {
            metrics_jsonl_for_each(jsonl_path, 0, [&](std::string_view line) {
                if (!metrics_line_has_kind(line, "train") && !metrics_line_has_kind(line, "eval")) return;
                const std::optional<int64_t> step = line_step(line);
                if (!step || *step < query.since || *step >= held.first_step) return;
                if (const auto r = metrics_record_parse(line); r && (r->kind == "train" || r->kind == "eval"))
                    builder.add(*r);
            });
        } catch (const core::Error&) {
            // The file went away (a run directory cleaned up): the ring's values are still an answer.
        }
    }
    for (const MetricsRecordPtr& r : held.lines) builder.add(*r);
    return builder.to_json();
}

nlohmann::json metrics_events(const MetricsRing& ring, int64_t since) {
    nlohmann::json events = nlohmann::json::array();
    for (const MetricsRecordPtr& r : ring.events_since(since)) {
        nlohmann::json e = r->fields;
        const auto name = e.find("event");
        e["alarm"] = name != e.end() && name->is_string() && metrics_event_is_alarm(name->get<std::string>());
        e["step"] = r->step;
        e["time"] = r->time;
        events.push_back(std::move(e));
    }
    const MetricsEventCounts counts = ring.event_counts();
    return {{"events", std::move(events)}, {"alarms", counts.alarms}, {"restarts", counts.restarts}};
}

}  // namespace mt::train
