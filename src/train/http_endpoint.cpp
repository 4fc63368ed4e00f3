// The endpoint's routes on the bounded server: a screen before routing (method, body, Host, route), then each route
// answered from the ring; and the training's start of it.
#include "train/http_endpoint.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "core/error.h"
#include "train/bounded_http_server.h"
#include "train/config.h"
#include "train/dashboard_page.h"
#include "train/metrics.h"
#include "train/metrics_ring.h"
#include "train/metrics_series.h"

namespace mt::train {

namespace {

using HandlerResponse = httplib::Server::HandlerResponse;

constexpr std::array<const char*, 4> kRoutes = {"/", "/metrics", "/api/series", "/api/events"};

// The page loads nothing from elsewhere and runs only its own inline script and style; it fetches only this origin.
constexpr const char* kPagePolicy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' "
    "data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// The host part of a Host header ("127.0.0.1:9477" -> "127.0.0.1", "[::1]:9477" -> "::1").
std::string host_name(const std::string& host) {
    if (host.starts_with('[')) {
        const size_t close = host.find(']');
        return close == std::string::npos ? host : host.substr(1, close - 1);
    }
    return host.substr(0, host.find(':'));
}

void answer_text(httplib::Response& res, int status, const std::string& text) {
    res.status = status;
    res.set_content(text + "\n", "text/plain; charset=utf-8");
}

void answer_json(httplib::Response& res, const nlohmann::json& body) {
    // Replace, not throw, on invalid UTF-8 in a string some line carried (an event's detail from a damaged file).
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

// Refuses query parameters other than `allowed`, so that a mistyped name is an error rather than ignored.
bool only_parameters(const httplib::Request& req, httplib::Response& res, const std::set<std::string>& allowed) {
    for (const auto& [key, value] : req.params) {
        if (allowed.contains(key) && req.get_param_value_count(key) == 1) continue;
        answer_text(res,
                    400,
                    allowed.contains(key) ? fmt::format("{}: given more than once", key)
                                          : fmt::format("unknown parameter '{}'", key.substr(0, 64)));
        return false;
    }
    return true;
}

}  // namespace

bool http_address_valid(const std::string& address) {
    unsigned char buf[sizeof(in6_addr)];
    return ::inet_pton(AF_INET, address.c_str(), buf) == 1 || ::inet_pton(AF_INET6, address.c_str(), buf) == 1;
}

bool http_address_is_loopback(const std::string& address) {
    in_addr v4{};
    in6_addr v6{};
    if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    return ::inet_pton(AF_INET6, address.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

void http_warn_if_not_loopback(const std::string& address, const std::string& setting) {
    if (http_address_is_loopback(address)) return;
    fmt::print(
        "moetrain: warning: {} serves the metrics and the dashboard to other machines, without authentication or "
        "encryption; prefer 127.0.0.1 and an SSH tunnel (docs/operations.md)\n",
        setting);
}

struct HttpEndpoint::Impl {
    std::shared_ptr<const MetricsRing> ring;
    HttpEndpointOptions options;
    std::unique_ptr<BoundedHttpServer> server = BoundedHttpServer::create();
    std::thread thread;
    int port = 0;

    // Before routing: what any request must be. Handled ends the request with the answer set here.
    HandlerResponse screen(const httplib::Request& req, httplib::Response& res) const {
        if (req.method != "GET" && req.method != "HEAD") {
            res.set_header("Allow", "GET, HEAD");
            answer_text(res, 405, fmt::format("{} is not allowed: this endpoint is read-only (GET)", req.method));
            return HandlerResponse::Handled;
        }
        const std::string length = req.get_header_value("Content-Length");
        if ((!length.empty() && length != "0") || req.has_header("Transfer-Encoding")) {
            answer_text(res, 413, "requests to this endpoint have no body");
            return HandlerResponse::Handled;
        }
        if (http_address_is_loopback(options.bind) && req.has_header("Host")) {
            const std::string host = host_name(req.get_header_value("Host"));
            if (host != "localhost" && !http_address_is_loopback(host)) {
                answer_text(res, 403, "this endpoint listens on loopback only; use a loopback Host (127.0.0.1)");
                return HandlerResponse::Handled;
            }
        }
        if (std::find(kRoutes.begin(), kRoutes.end(), req.path) == kRoutes.end()) {
            answer_text(res, 404, "not found: the routes are /, /metrics, /api/series and /api/events");
            return HandlerResponse::Handled;
        }
        return HandlerResponse::Unhandled;
    }

    void metrics(const httplib::Request&, httplib::Response& res) const {
        const MetricsEventCounts counts = ring->event_counts();
        res.set_content(prometheus_exposition(ring->latest(), options.prometheus, &counts),
                        "text/plain; version=0.0.4; charset=utf-8");
    }

    void series(const httplib::Request& req, httplib::Response& res) const {
        if (!only_parameters(req, res, {"names", "since", "points"})) return;
        try {
            const SeriesQuery query = series_query_parse(
                req.get_param_value("names"), req.get_param_value("since"), req.get_param_value("points"));
            answer_json(res, metrics_series(*ring, options.jsonl_path, query));
        } catch (const core::Error& e) {
            answer_text(res, 400, e.what());
        }
    }

    void events(const httplib::Request& req, httplib::Response& res) const {
        if (!only_parameters(req, res, {"since"})) return;
        try {
            answer_json(res, metrics_events(*ring, series_since_parse(req.get_param_value("since"))));
        } catch (const core::Error& e) {
            answer_text(res, 400, e.what());
        }
    }

    void page(const httplib::Request&, httplib::Response& res) const {
        res.set_header("Content-Security-Policy", kPagePolicy);
        res.set_content(kDashboardHtml.data(), kDashboardHtml.size(), "text/html; charset=utf-8");
    }

    void install_routes() {
        server->set_default_headers({{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}});
        server->set_pre_routing_handler([this](const auto& req, auto& res) { return screen(req, res); });
        server->Get("/metrics", [this](const auto& req, auto& res) { metrics(req, res); });
        server->Get("/api/series", [this](const auto& req, auto& res) { series(req, res); });
        server->Get("/api/events", [this](const auto& req, auto& res) { events(req, res); });
        server->Get("/", [this](const auto& req, auto& res) { page(req, res); });
        // httplib's own refusals (a malformed request line 400, a request line over 8 KiB 414) get a text body too.
        server->set_error_handler([](const auto&, auto& res) {
            if (res.body.empty())
                answer_text(res, res.status, res.status == 400 ? "bad request" : fmt::format("HTTP {}", res.status));
        });
        server->set_exception_handler([](const auto&, auto& res, std::exception_ptr) {
            answer_text(res, 500, "internal error answering this request");
        });
    }
};

HttpEndpoint::HttpEndpoint(std::shared_ptr<const MetricsRing> ring, HttpEndpointOptions options)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.ring = std::move(ring);
    m.options = std::move(options);
    if (!http_address_valid(m.options.bind))
        core::fail(core::ExitCode::usage,
                   "metrics.bind = \"{}\" is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1)",
                   m.options.bind);
    m.install_routes();
    m.port = m.server->bind_exclusive(m.options.bind, m.options.port);
    if (m.port < 0) {
        const int err = errno;
        if (err == EADDRINUSE || err == EACCES)
            core::fail_hint(core::ExitCode::usage,
                            fmt::format("choose a free port: {} = another number, or stop what listens there",
                                        m.options.port_option),
                            "cannot serve metrics on {}:{}: {} ({} = {})",
                            m.options.bind,
                            m.options.port,
                            std::strerror(err),
                            m.options.port_option,
                            m.options.port);
        core::fail_hint(core::ExitCode::usage,
                        "metrics.bind must be an address of this machine (127.0.0.1 serves this machine only)",
                        "cannot serve metrics on {}:{}: {} (metrics.bind = \"{}\")",
                        m.options.bind,
                        m.options.port,
                        err != 0 ? std::strerror(err) : "the address cannot be bound",
                        m.options.bind);
    }
    m.thread = std::thread([&m] { m.server->listen_after_bind(); });
    // stop() only ends a server that has started listening: wait for it, so that the destructor never misses it.
    for (int i = 0; i < 5000 && !m.server->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

HttpEndpoint::~HttpEndpoint() {
    impl_->server->begin_shutdown();
    impl_->server->stop();
    if (impl_->thread.joinable()) impl_->thread.join();
}

int HttpEndpoint::port() const {
    return impl_->port;
}

std::string HttpEndpoint::url() const {
    const std::string& bind = impl_->options.bind;
    const bool v6 = bind.find(':') != std::string::npos;
    return fmt::format("http://{}{}{}:{}/", v6 ? "[" : "", bind, v6 ? "]" : "", impl_->port);
}

std::unique_ptr<HttpEndpoint> http_endpoint_start(const JobConfig& cfg, MetricsLog& log, bool announce) {
    if (cfg.metrics.port == 0) return nullptr;
    auto ring = std::make_shared<MetricsRing>();
    const std::string jsonl = cfg.metrics.jsonl ? cfg.run.dir + "/metrics.jsonl" : "";
    // The lines already there (a resumed run): the dashboard shows the whole run, and the restart events the
    // supervisor wrote while the job was down count in moetrain_restarts_total.
    if (!jsonl.empty() && std::filesystem::exists(jsonl)) ring->load_jsonl(jsonl);
    http_warn_if_not_loopback(cfg.metrics.bind, fmt::format("metrics.bind = \"{}\"", cfg.metrics.bind));
    auto endpoint = std::make_unique<HttpEndpoint>(
        ring,
        HttpEndpointOptions{.bind = cfg.metrics.bind,
                            .port = static_cast<int>(cfg.metrics.port),
                            .jsonl_path = jsonl,
                            .prometheus = {.job = cfg.run.name, .per_expert = cfg.metrics.prometheus_per_expert}});
    log.add_sink(ring);
    if (announce) fmt::print("moetrain: metrics and dashboard at {} (metrics.port)\n", endpoint->url());
    return endpoint;
}

}  // namespace mt::train
