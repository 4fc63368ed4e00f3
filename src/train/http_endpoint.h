// HttpEndpoint: the metrics endpoint and live dashboard that rank 0 serves on metrics.bind:metrics.port
// (operations.md §7, docs/operations.md), from a MetricsRing, on background threads. Routes, GET (and HEAD) only:
//   /metrics      Prometheus text 0.0.4 of the last train and eval line, with the event counters
//   /api/series   ?names=a,b&since=STEP&points=N: JSON points of the named metric paths (metrics_series.h)
//   /api/events   ?since=STEP: JSON event lines and counters
//   /             the dashboard page (HTML, CSS and JS compiled into the binary)
// Anything else is 404, another method 405, a request with a body 413; nothing is read from the file system but the
// run's metrics.jsonl. Bound to a loopback address, it answers only requests whose Host names a loopback address, so
// a web page cannot reach it by DNS rebinding.
#pragma once

#include <memory>
#include <string>

#include "train/prometheus.h"

namespace mt::train {

class MetricsRing;
class MetricsLog;
struct JobConfig;

struct HttpEndpointOptions {
    std::string bind = "127.0.0.1";            // a numeric IPv4 or IPv6 address
    int port = 0;                              // 0: a free port the system picks
    std::string port_option = "metrics.port";  // the setting a taken port's error names
    std::string jsonl_path = {};               // older values for /api/series; empty: the ring only
    PrometheusOptions prometheus = {};
};

class HttpEndpoint {
   public:
    // Binds and starts serving. A port in use, or an address this machine does not have, is exit 2 naming the
    // setting (the port's port_option).
    HttpEndpoint(std::shared_ptr<const MetricsRing> ring, HttpEndpointOptions options);
    // Stops accepting, ends the requests in flight (a slow client's within a few seconds) and joins the threads.
    ~HttpEndpoint();
    HttpEndpoint(const HttpEndpoint&) = delete;
    HttpEndpoint& operator=(const HttpEndpoint&) = delete;

    int port() const;
    // http://<bind>:<port>/ (IPv6 in brackets).
    std::string url() const;

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Whether the address is a numeric IPv4 or IPv6 address (what metrics.bind accepts).
bool http_address_valid(const std::string& address);
// Whether it is a loopback address (127.0.0.0/8, ::1).
bool http_address_is_loopback(const std::string& address);
// Prints the warning that an address other than loopback serves other machines; `setting` names where it came from
// ("metrics.bind = \"0.0.0.0\"", "--bind 0.0.0.0"). Nothing for a loopback address.
void http_warn_if_not_loopback(const std::string& address, const std::string& setting);

// The training's endpoint (nullptr when metrics.port = 0): a ring fed by `log` from now on, holding first the history
// already in the run's metrics.jsonl (a resumed run's steps, the supervisor's restart events), served on
// metrics.bind:metrics.port. A non-loopback metrics.bind prints a warning; `announce` prints the URL.
std::unique_ptr<HttpEndpoint> http_endpoint_start(const JobConfig& cfg, MetricsLog& log, bool announce);

}  // namespace mt::train
