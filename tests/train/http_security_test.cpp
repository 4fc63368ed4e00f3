// The endpoint against hostile or broken clients (raw sockets): malformed request lines, heads over 8 KiB, path
// traversal, a foreign Host (DNS rebinding), a client that never finishes its request, and a flood of connections
// while a training thread keeps appending to the ring.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "support/http_raw.h"
#include "train/bounded_http_server.h"
#include "train/http_endpoint.h"
#include "train/metrics_ring.h"

namespace {

using mt::testing::http_body;
using mt::testing::http_raw;
using mt::testing::http_status;
using mt::train::HttpEndpoint;
using mt::train::MetricsRing;
using Clock = std::chrono::steady_clock;

std::shared_ptr<MetricsRing> ring_with_a_line() {
    auto ring = std::make_shared<MetricsRing>();
    ring->on_line(1, 1.0, "train", {{"loss", 2.0}});
    return ring;
}

HttpEndpoint serve(std::shared_ptr<MetricsRing> ring) {
    return HttpEndpoint(std::move(ring), {.bind = "127.0.0.1", .port = 0});
}

bool still_serves(int port) {
    httplib::Client client("127.0.0.1", port);
    const auto res = client.Get("/metrics");
    return res && res->status == 200 && res->body.find("moetrain_train_loss") != std::string::npos;
}

int process_threads() {
    int n = 0;
    DIR* d = ::opendir("/proc/self/task");
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    return n;
}

TEST(HttpSecurity, MalformedRequestsGet4xx) {
    const HttpEndpoint endpoint = serve(ring_with_a_line());
    const std::vector<std::string> requests = {
        "GARBAGE\r\n\r\n",
        "GET\r\n\r\n",
        "GET /metrics\r\n\r\n",
        "GET /metrics HTTP/7.0\r\n\r\n",
        "FROB /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\n\n",
        "\r\n\r\n",
        std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 17),
        std::string("GET /met\0rics HTTP/1.1\r\n\r\n", 26),
    };
    for (const std::string& request : requests) {
        const std::string answer = http_raw(endpoint.port(), request);
        const int status = http_status(answer);
        EXPECT_TRUE(status >= 400 && status < 500) << "request " << ::testing::PrintToString(request) << ": " << answer;
    }
    EXPECT_TRUE(still_serves(endpoint.port()));
}

// The request line and headers together are at most 8 KiB: longer is 431 whichever part is long, 7 KiB is served.
TEST(HttpSecurity, HeadsOver8KiBAre431) {
    const HttpEndpoint endpoint = serve(ring_with_a_line());
    const std::string host = "Host: 127.0.0.1\r\n";
    std::string many_lines;
    for (int i = 0; i < 200; ++i) many_lines += fmt::format("X-Filler-{}: {}\r\n", i, std::string(40, 'x'));
    const std::vector<std::string> large = {
        "GET /metrics?" + std::string(9000, 'a') + " HTTP/1.1\r\n" + host + "\r\n",
        "GET /metrics HTTP/1.1\r\n" + host + many_lines + "\r\n",
        "GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(9000, 'b') + "\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(1 << 20, 'c') + "\r\n\r\n",
    };
    for (const std::string& request : large) {
        const std::string answer = http_raw(endpoint.port(), request);
        EXPECT_EQ(http_status(answer), 431) << answer.substr(0, 200);
    }
    const std::string fits = "GET /metrics HTTP/1.1\r\n" + host + "X-Big: " + std::string(7000, 'd') + "\r\n\r\n";
    EXPECT_EQ(http_status(http_raw(endpoint.port(), fits)), 200);
    EXPECT_TRUE(still_serves(endpoint.port()));
}

// No URL reaches a file: every traversal is 404 (or 400), and no answer holds a file's content.
TEST(HttpSecurity, PathTraversalNeverServesFiles) {
    const HttpEndpoint endpoint = serve(ring_with_a_line());
    for (const char* target : {"/../../etc/passwd",
                               "/%2e%2e/%2e%2e/etc/passwd",
                               "/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
                               "/api/../metrics",
                               "/api/%2e%2e/metrics",
                               "/..%2f..%2f..%2fetc/passwd",
                               "//etc/passwd",
                               "/./metrics",
                               "/metrics/../../../../etc/passwd",
                               "/%00/etc/passwd",
                               "/etc/passwd",
                               "/proc/self/environ",
                               "/..\\..\\etc\\passwd",
                               "http://127.0.0.1/../etc/passwd",
                               "/api/series/../../etc/passwd?names=train/loss"}) {
        const std::string answer =
            http_raw(endpoint.port(), fmt::format("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", target));
        const int status = http_status(answer);
        EXPECT_TRUE(status == 404 || status == 400) << target << ": " << answer;
        EXPECT_EQ(http_body(answer).find("root:"), std::string::npos) << target;
    }
    EXPECT_TRUE(still_serves(endpoint.port()));
}

// Bound to loopback, a request whose Host is a name (what a page reached by DNS rebinding sends) is refused.
TEST(HttpSecurity, ALoopbackEndpointWantsALoopbackHost) {
    const HttpEndpoint endpoint = serve(ring_with_a_line());
    auto status_for = [&](const std::string& host) {
        return http_status(http_raw(endpoint.port(), "GET /metrics HTTP/1.1\r\nHost: " + host + "\r\n\r\n"));
    };
    EXPECT_EQ(status_for("evil.example"), 403);
    EXPECT_EQ(status_for("evil.example:" + std::to_string(endpoint.port())), 403);
    EXPECT_EQ(status_for("10.1.2.3"), 403);
    EXPECT_EQ(status_for("127.0.0.1:" + std::to_string(endpoint.port())), 200);
    EXPECT_EQ(status_for("localhost:" + std::to_string(endpoint.port())), 200);
    EXPECT_EQ(status_for("[::1]:" + std::to_string(endpoint.port())), 200);
    EXPECT_EQ(http_status(http_raw(endpoint.port(), "GET /metrics HTTP/1.0\r\n\r\n")), 200);  // no Host at all
}

// A client that sends half a request holds one worker until the head deadline (then 408); others are served meanwhile.
TEST(HttpSecurity, ASlowClientTimesOutWithoutBlockingOthers) {
    const HttpEndpoint endpoint = serve(ring_with_a_line());
    const int slow = mt::testing::http_connect(endpoint.port());
    ASSERT_GE(slow, 0);
    mt::testing::http_send(slow, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    const Clock::time_point start = Clock::now();
    EXPECT_TRUE(still_serves(endpoint.port()));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
    const std::string answer = mt::testing::http_receive(slow);
    ::close(slow);
    EXPECT_EQ(http_status(answer), 408) << answer;
    EXPECT_GE(Clock::now() - start, mt::train::BoundedHttpServer::kHeadDeadline - std::chrono::milliseconds(200));
    EXPECT_LT(Clock::now() - start, mt::train::BoundedHttpServer::kHeadDeadline + std::chrono::seconds(3));
}

// 300 connections at once while a "training" thread appends to the ring: each is answered (200) or refused (503, or
// closed), the server adds no thread, the appends stay fast, and the endpoint serves normally afterwards.
TEST(HttpSecurity, AFloodIsAnsweredOrRefusedWithBoundedThreads) {
    auto ring = ring_with_a_line();
    const HttpEndpoint endpoint = serve(ring);
    const int baseline = process_threads();
    constexpr int kClients = 20, kPerClient = 15;
    std::atomic<bool> flooding{true};
    std::atomic<int64_t> slowest_append_us{0}, appends{0};
    std::thread training([&] {
        for (int64_t step = 2; flooding; ++step) {
            const Clock::time_point t = Clock::now();
            ring->on_line(step, 0.0, "train", {{"loss", 1.0}, {"lr", 1e-3}});
            const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
            slowest_append_us = std::max(slowest_append_us.load(), us);
            ++appends;
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    });
    std::atomic<int> ok{0}, busy{0}, closed{0}, other{0}, max_threads{0};
    std::vector<std::thread> clients;
    const Clock::time_point start = Clock::now();
    for (int c = 0; c < kClients; ++c)
        clients.emplace_back([&] {
            std::vector<int> socks;
            for (int i = 0; i < kPerClient; ++i) socks.push_back(mt::testing::http_connect(endpoint.port(), 20));
            for (const int s : socks)
                if (s >= 0) mt::testing::http_send(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            max_threads = std::max(max_threads.load(), process_threads());
            for (const int s : socks) {
                const std::string answer = s >= 0 ? mt::testing::http_receive(s) : "";
                if (s >= 0) ::close(s);
                const int status = http_status(answer);
                (status == 200 ? ok : status == 503 ? busy : status == 0 ? closed : other)++;
            }
        });
    for (std::thread& t : clients) t.join();
    const auto elapsed = Clock::now() - start;
    flooding = false;
    training.join();
    const std::string outcome = fmt::format("200: {}, 503: {}, closed: {}, other: {}, slowest append {} us, {} appends",
                                            ok.load(),
                                            busy.load(),
                                            closed.load(),
                                            other.load(),
                                            slowest_append_us.load(),
                                            appends.load());
    fmt::print("flood: {}\n", outcome);
    SCOPED_TRACE(outcome);
    EXPECT_EQ(ok + busy + closed + other, kClients * kPerClient);
    EXPECT_EQ(other, 0);
    EXPECT_GT(ok, 0);
    EXPECT_LT(elapsed, std::chrono::seconds(30));
    // The server's threads (the listener and its fixed workers) were there before the flood; only the test's came.
    EXPECT_LE(max_threads.load(), baseline + kClients + 1);
    EXPECT_LT(slowest_append_us.load(), 100'000);
    EXPECT_TRUE(still_serves(endpoint.port()));
}

}  // namespace
