// The answers of the HTTP endpoint's JSON routes (docs/operations.md): /api/series, the points of named metrics
// from the ring (and from metrics.jsonl for steps the ring no longer holds), and /api/events. Series are named by
// metric path, as TensorBoard tags are ("train/loss", "eval/loss", "moe/load/l03"); a `*` segment matches any one
// segment ("moe/load/*", "layer/*/grad_norm").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/metrics_ring.h"

namespace mt::train {

// Bounds of one request, so that an answer's size and cost stay bounded whatever the URL says.
inline constexpr size_t kSeriesMaxNames = 64;      // patterns per request
inline constexpr size_t kSeriesMaxMatches = 1024;  // series per answer
inline constexpr size_t kSeriesMaxPoints = 10000;  // points per series
inline constexpr size_t kSeriesDefaultPoints = 2000;

struct SeriesQuery {
    std::vector<std::string> names;  // metric paths or patterns
    int64_t since = 0;               // the first step wanted
    size_t max_points = kSeriesDefaultPoints;
};

// The query of `names=a,b&since=S&points=N` (values already URL-decoded; empty: not given). A bad value throws
// core::Error(usage) whose message names the parameter (the endpoint answers it with 400).
SeriesQuery series_query_parse(const std::string& names, const std::string& since, const std::string& points);

// The `since` parameter: empty is 0; not an integer throws core::Error(usage) naming it.
int64_t series_since_parse(const std::string& since);

// Whether the metric path matches the pattern segment by segment, `*` matching any one segment.
bool metric_path_matches(const std::string& pattern, const std::string& path);

// {"since": S, "last_step": L, "series": {"<path>": {"steps": [...], "values": [...]}}}: every series of a train or
// eval line whose step is at least `since`, numbers, booleans (0/1) or arrays (per-expert loads), in step order. A
// step logged again after a restart replaces the values logged before it. Thinned to max_points by an even stride
// (the last point always kept). jsonl_path, when not empty, supplies the steps older than the ring's.
nlohmann::json metrics_series(const MetricsRing& ring, const std::string& jsonl_path, const SeriesQuery& query);

// {"events": [{"step", "time", "event", "alarm", ...}], "alarms": {"<kind>": n}, "restarts": n}: the event lines kept
// whose step is at least `since` ("alarm": whether the event is one, metrics_event_is_alarm), and the counters of all
// of them.
nlohmann::json metrics_events(const MetricsRing& ring, int64_t since);

}  // namespace mt::train
