// The HTTP endpoint's routes against a ring (httplib's client on an ephemeral port): /metrics parsed by the strict
// 0.0.4 parser with its event counters, the JSON API, the page, HEAD, refusals of other routes, methods, bodies and
// bad parameters; the training's endpoint (config keys, resumed history, the non-loopback warning, a taken port).
#include "train/http_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>

#include "core/error.h"
#include "support/http_raw.h"
#include "support/prometheus_parser.h"
#include "support/tiny_job.h"
#include "train/metrics_ring.h"
#include "train/trainer.h"

namespace {

using mt::testing::fresh_dir;
using mt::train::HttpEndpoint;
using mt::train::MetricsRing;
using nlohmann::json;

std::shared_ptr<MetricsRing> sample_ring() {
    auto ring = std::make_shared<MetricsRing>();
    ring->on_line(7,
                  1.0,
                  "train",
                  {{"loss", 2.5},
                   {"lr", 1e-3},
                   {"grad_norm", 0.5},
                   {"tokens_seen", 4096},
                   {"mem/allocated", 1000},
                   {"moe/max_vio/l01", 0.25},
                   {"moe/load/l01", {0.5, 1.5}}});
    ring->on_line(7, 1.0, "eval", {{"val_loss", 2.75}});
    ring->on_line(5, 0.5, "event", {{"event", "loss_spike"}, {"detail", "bad \xff byte"}});
    ring->on_line(6, 0.7, "event", {{"event", "restart"}, {"reason", "signal"}});
    return ring;
}

HttpEndpoint serve(std::shared_ptr<MetricsRing> ring, const std::string& job = "run \"7\"") {
    return HttpEndpoint(std::move(ring), {.bind = "127.0.0.1", .port = 0, .prometheus = {.job = job}});
}

TEST(HttpEndpoint, MetricsIsStrictPrometheusWithEventCounters) {
    const HttpEndpoint endpoint = serve(sample_ring());
    httplib::Client client("127.0.0.1", endpoint.port());
    const auto res = client.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    EXPECT_EQ(res->get_header_value("Cache-Control"), "no-store");
    SCOPED_TRACE(res->body);
    const mt::testing::PromExposition e = mt::testing::prometheus_parse(res->body);
    auto value = [&](const std::string& family, const std::map<std::string, std::string>& labels) {
        const auto* f = e.find(family);
        EXPECT_NE(f, nullptr) << family;
        if (f == nullptr) return std::nan("");
        for (const auto& s : f->samples) {
            auto want = labels;
            want["job"] = "run \"7\"";
            if (s.labels == want) return s.value;
        }
        ADD_FAILURE() << family << " has no sample with the labels asked for";
        return std::nan("");
    };
    EXPECT_EQ(value("moetrain_train_loss", {}), 2.5);
    EXPECT_EQ(value("moetrain_eval_loss", {}), 2.75);
    EXPECT_EQ(value("moetrain_steps_total", {}), 7.0);
    EXPECT_EQ(value("moetrain_moe_max_vio", {{"layer", "1"}}), 0.25);
    EXPECT_EQ(value("moetrain_alarms_total", {{"kind", "loss_spike"}}), 1.0);
    EXPECT_EQ(value("moetrain_alarms_total", {{"kind", "restart"}}), 1.0);
    EXPECT_EQ(value("moetrain_alarms_total", {{"kind", "grad_spike"}}), 0.0);
    EXPECT_EQ(value("moetrain_restarts_total", {}), 1.0);
    EXPECT_EQ(e.find("moetrain_alarms_total")->type, "counter");
    EXPECT_EQ(e.find("moetrain_moe_load"), nullptr);  // per-expert series are off unless asked for
}

TEST(HttpEndpoint, JsonRoutesAndThePage) {
    const HttpEndpoint endpoint = serve(sample_ring());
    httplib::Client client("127.0.0.1", endpoint.port());
    const auto series = client.Get("/api/series?names=train/loss,eval/loss,moe/load/*&since=0&points=100");
    ASSERT_TRUE(series);
    EXPECT_EQ(series->status, 200);
    EXPECT_EQ(series->get_header_value("Content-Type"), "application/json");
    const json s = json::parse(series->body);
    EXPECT_EQ(s["series"]["train/loss"]["values"], json({2.5}));
    EXPECT_EQ(s["series"]["eval/loss"]["steps"], json({7}));
    EXPECT_EQ(s["series"]["moe/load/l01"]["values"], json({{0.5, 1.5}}));
    EXPECT_EQ(s["last_step"], 7);
    const auto events = client.Get("/api/events?since=6");
    ASSERT_TRUE(events);
    const json e = json::parse(events->body);  // the invalid UTF-8 of a detail is replaced, not a failure
    ASSERT_EQ(e["events"].size(), 1u);
    EXPECT_EQ(e["events"][0]["event"], "restart");
    EXPECT_EQ(e["restarts"], 1);
    EXPECT_EQ(json::parse(client.Get("/api/events")->body)["events"][0]["detail"], "bad \xEF\xBF\xBD byte");
    const auto page = client.Get("/");
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_NE(page->get_header_value("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
    EXPECT_NE(page->body.find("getContext('2d')"), std::string::npos);
    EXPECT_NE(page->body.find("/api/series"), std::string::npos);
    EXPECT_EQ(page->body.find("@DASHBOARD_"), std::string::npos);  // both assets were put inline
    EXPECT_EQ(page->body.find("http://"), std::string::npos);      // nothing loaded from elsewhere
    EXPECT_EQ(page->body.find("https://"), std::string::npos);
    const auto head = client.Head("/metrics");
    ASSERT_TRUE(head);
    EXPECT_EQ(head->status, 200);
    EXPECT_TRUE(head->body.empty());
}

TEST(HttpEndpoint, OnlyItsRoutesOnlyGetAndNoBody) {
    const HttpEndpoint endpoint = serve(sample_ring());
    httplib::Client client("127.0.0.1", endpoint.port());
    for (const char* path :
         {"/x", "/metrics/", "/index.html", "/api", "/api/series/x", "/API/series", "/metrics.prom"}) {
        const auto res = client.Get(path);
        ASSERT_TRUE(res) << path;
        EXPECT_EQ(res->status, 404) << path;
    }
    for (const auto& res : {client.Post("/metrics", "x", "text/plain"),
                            client.Put("/", "x", "text/plain"),
                            client.Delete("/api/events"),
                            client.Patch("/api/series", "x", "text/plain"),
                            client.Options("/")}) {
        ASSERT_TRUE(res);
        EXPECT_EQ(res->status, 405);
        EXPECT_EQ(res->get_header_value("Allow"), "GET, HEAD");
    }
    const std::string with_body = mt::testing::http_raw(
        endpoint.port(), "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\n\r\nabcd");
    EXPECT_EQ(mt::testing::http_status(with_body), 413) << with_body;
    const std::string chunked = mt::testing::http_raw(
        endpoint.port(),
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n");
    EXPECT_EQ(mt::testing::http_status(chunked), 413) << chunked;
}

TEST(HttpEndpoint, BadParametersAre400NamingThem) {
    const HttpEndpoint endpoint = serve(sample_ring());
    httplib::Client client("127.0.0.1", endpoint.port());
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"/api/series", "names:"},
        {"/api/series?names=", "names:"},
        {"/api/series?names=train/loss&since=abc", "since:"},
        {"/api/series?names=train/loss&points=0", "points:"},
        {"/api/series?names=train/loss&color=red", "unknown parameter 'color'"},
        {"/api/series?names=a&names=b", "names: given more than once"},
        {"/api/events?since=x", "since:"},
        {"/api/events?names=a", "unknown parameter 'names'"},
    };
    for (const auto& [path, message] : cases) {
        const auto res = client.Get(path);
        ASSERT_TRUE(res) << path;
        EXPECT_EQ(res->status, 400) << path;
        EXPECT_NE(res->body.find(message), std::string::npos) << path << ": " << res->body;
    }
}

TEST(HttpEndpoint, ATakenPortOrAForeignAddressIsExit2NamingTheSetting) {
    const HttpEndpoint first = serve(sample_ring());
    auto refusal = [](const mt::train::HttpEndpointOptions& options) {
        try {
            const HttpEndpoint second(std::make_shared<MetricsRing>(), options);
        } catch (const mt::core::Error& e) {
            EXPECT_EQ(e.code(), mt::core::ExitCode::usage);
            return std::string(e.what()) + " | " + e.hint();
        }
        return std::string("served");
    };
    const std::string taken = refusal({.bind = "127.0.0.1", .port = first.port()});
    EXPECT_NE(taken.find(fmt::format("metrics.port = {}", first.port())), std::string::npos) << taken;
    EXPECT_NE(taken.find("in use"), std::string::npos) << taken;
    const std::string dashboard = refusal({.bind = "127.0.0.1", .port = first.port(), .port_option = "--port"});
    EXPECT_NE(dashboard.find("--port"), std::string::npos) << dashboard;
    // 192.0.2.1 (TEST-NET-1, RFC 5737) is no address of this machine.
    const std::string foreign = refusal({.bind = "192.0.2.1", .port = 0});
    EXPECT_NE(foreign.find("metrics.bind"), std::string::npos) << foreign;
    EXPECT_NE(refusal({.bind = "localhost", .port = 0}).find("metrics.bind"), std::string::npos);
}

TEST(HttpEndpoint, AddressesAndTheConfigKeys) {
    using mt::train::http_address_is_loopback;
    using mt::train::http_address_valid;
    EXPECT_TRUE(http_address_valid("127.0.0.1") && http_address_valid("::1") && http_address_valid("0.0.0.0"));
    EXPECT_FALSE(http_address_valid("localhost") || http_address_valid("") || http_address_valid("1.2.3"));
    EXPECT_TRUE(http_address_is_loopback("127.0.0.1") && http_address_is_loopback("127.1.2.3"));
    EXPECT_TRUE(http_address_is_loopback("::1"));
    EXPECT_FALSE(http_address_is_loopback("0.0.0.0") || http_address_is_loopback("::") ||
                 http_address_is_loopback("10.0.0.1"));
    // Off and loopback by default; a bad address is refused when the config is read.
    const std::string dir = fresh_dir("keys");
    const auto cfg = mt::testing::tiny_job(dir);
    EXPECT_EQ(cfg.metrics.port, 0);
    EXPECT_EQ(cfg.metrics.bind, "127.0.0.1");
    mt::train::MetricsLog log("");
    EXPECT_EQ(mt::train::http_endpoint_start(cfg, log, false), nullptr);
    for (const char* bad : {"metrics.bind=\"localhost\"", "metrics.port=70000", "metrics.port=-1"}) {
        try {
            mt::testing::tiny_job(dir, {bad});
            ADD_FAILURE() << bad << " was accepted";
        } catch (const mt::core::Error& e) {
            EXPECT_EQ(e.code(), mt::core::ExitCode::usage);
            EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(0, 12)), std::string::npos) << e.what();
        }
    }
}

// A resumed run's endpoint starts with the history in metrics.jsonl (the supervisor's restart events included); a
// bind other than loopback prints a warning.
TEST(HttpEndpoint, TheTrainingsEndpointLoadsTheHistoryAndWarnsOffLoopback) {
    const std::string dir = fresh_dir("history");
    auto cfg = mt::testing::tiny_job(dir, {"metrics.bind=\"0.0.0.0\""});
    cfg.metrics.port = mt::testing::http_free_port();
    std::filesystem::create_directories(cfg.run.dir);
    std::ofstream(cfg.run.dir + "/metrics.jsonl")
        << R"({"kind":"train","loss":3.0,"step":4,"time":1.0})"
        << "\n"
        << R"({"event":"restart","kind":"event","reason":"hang","step":4,"time":2.0})"
        << "\n";
    mt::train::MetricsLog log(cfg.run.dir + "/metrics.jsonl");
    ::testing::internal::CaptureStdout();
    const auto endpoint = mt::train::http_endpoint_start(cfg, log, true);
    const std::string out = ::testing::internal::GetCapturedStdout();
    ASSERT_NE(endpoint, nullptr);
    EXPECT_NE(out.find("warning: metrics.bind = \"0.0.0.0\""), std::string::npos) << out;
    EXPECT_NE(out.find(fmt::format("http://0.0.0.0:{}/", cfg.metrics.port)), std::string::npos) << out;
    log.write(5, "train", {{"loss", 2.0}});
    httplib::Client client("127.0.0.1", static_cast<int>(cfg.metrics.port));
    const json s = json::parse(client.Get("/api/series?names=train/loss")->body);
    EXPECT_EQ(s["series"]["train/loss"]["steps"], json({4, 5}));
    const auto e = mt::testing::prometheus_parse(client.Get("/metrics")->body);
    EXPECT_EQ(e.find("moetrain_restarts_total")->samples.at(0).value, 1.0);
    EXPECT_EQ(e.find("moetrain_train_loss")->samples.at(0).value, 2.0);
}

// A tiny MoE training with metrics.port set serves its own steps while its Trainer lives.
TEST(HttpEndpoint, ATinyTrainingServesItsRun) {
    const std::string dir = fresh_dir("train");
    const int port = mt::testing::http_free_port();
    mt::train::Trainer trainer(
        mt::testing::tiny_job(dir,
                              mt::testing::tiny_moe_overrides(
                                  {"train.steps=4", "moe.log_loads_every=2", fmt::format("metrics.port={}", port)})),
        false);
    trainer.run();
    httplib::Client client("127.0.0.1", port);
    const auto e = mt::testing::prometheus_parse(client.Get("/metrics")->body);
    EXPECT_EQ(e.find("moetrain_steps_total")->samples.at(0).value, 4.0);
    const json s = json::parse(client.Get("/api/series?names=train/loss,moe/load/*")->body);
    EXPECT_EQ(s["series"]["train/loss"]["steps"], json({1, 2, 3, 4}));
    EXPECT_EQ(s["series"]["moe/load/l01"]["steps"], json({2, 4}));
}

}  // namespace
