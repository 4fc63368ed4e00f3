// BoundedHttpServer: cpp-httplib's server with every per-connection cost bounded, for an endpoint that runs beside a
// training (docs/operations.md). cpp-httplib 0.11 reads any number of header lines into memory, keeps a connection
// for several requests and queues accepted connections without limit; here:
// * a request's head (request line, headers, blank line) is read by this class, at most kMaxHeadBytes within
//   kHeadDeadline, before httplib parses it: a longer head is answered 431, a slow one 408;
// * one request per connection, and no body is ever read (httplib sees the head only);
// * kWorkers threads serve the connections; at most kMaxQueued wait for one, and a connection beyond that is answered
//   503 by the accepting thread at once (a short write into an empty socket buffer);
// * every write has a deadline, so a client that stops reading holds a worker for seconds, not forever.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace mt::train {

class BoundedHttpServer final : public httplib::Server {
   public:
    static constexpr size_t kMaxHeadBytes = 8192;
    static constexpr std::chrono::milliseconds kHeadDeadline{3000};
    static constexpr std::chrono::milliseconds kWriteDeadline{2000};
    static constexpr size_t kWorkers = 4;
    static constexpr size_t kMaxQueued = 64;
    static constexpr int kListenBacklog = 128;

    // A server with the limits above (httplib's constructor would leave SIGPIPE ignored for the whole process; this
    // keeps the process's disposition).
    static std::unique_ptr<BoundedHttpServer> create();

    // Binds host:port (0: a free port) with SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second
    // process bind the same port without an error. Returns the port, or -1 with errno from the failed call.
    int bind_exclusive(const std::string& host, int port);

    // Makes connections still reading their head give up at once; call before stop().
    void begin_shutdown() {
        shutting_down_ = true;
    }

   private:
    BoundedHttpServer();
    bool process_and_close_socket(socket_t sock) override;
    std::atomic<bool> shutting_down_{false};
};

}  // namespace mt::train
