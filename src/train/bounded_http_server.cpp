// The bounded server: the accepting thread hands connections to a fixed pool through a bounded queue; a worker reads
// the request head itself under a size and time limit, then lets httplib parse and route it from memory.
#include "train/bounded_http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mt::train {

namespace {

using Clock = std::chrono::steady_clock;

// Set on the accepting thread while it runs a connection the queue had no room for: the connection is answered 503.
thread_local bool t_refuse = false;

// A fixed pool of workers and a bounded queue; a connection that does not fit is run on the accepting thread with
// t_refuse set (httplib's job closes the socket, so dropping the job would leak it).
class BoundedQueue final : public httplib::TaskQueue {
   public:
    BoundedQueue(size_t workers, size_t max_queued) : max_queued_(max_queued) {
        for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
    }
    ~BoundedQueue() override {
        if (!threads_.empty()) shutdown();
    }

    void enqueue(std::function<void()> fn) override {
        {
            const std::lock_guard lock(mutex_);
            if (jobs_.size() < max_queued_) {
                jobs_.push_back(std::move(fn));
                ready_.notify_one();
                return;
            }
        }
        t_refuse = true;
        fn();
        t_refuse = false;
    }

    // Runs the jobs still queued (each ends at once while the server shuts down), then joins the workers.
    void shutdown() override {
        {
            const std::lock_guard lock(mutex_);
            stop_ = true;
        }
        ready_.notify_all();
        for (std::thread& t : threads_) t.join();
        threads_.clear();
    }

   private:
    void work() {
        for (;;) {
            std::function<void()> job;
            {
                std::unique_lock lock(mutex_);
                ready_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
                if (jobs_.empty()) return;
                job = std::move(jobs_.front());
                jobs_.pop_front();
            }
            job();
        }
    }

    size_t max_queued_;
    std::mutex mutex_;
    std::condition_variable ready_;
    std::deque<std::function<void()>> jobs_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

int millis_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? static_cast<int>(left) : 0;
}

// Writes all of data before the deadline; false when the peer is gone or reads too slowly.
bool send_all(int sock, const char* data, size_t size, Clock::time_point deadline) {
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::send(sock, data + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
        pollfd p{sock, POLLOUT, 0};
        const int left = millis_until(deadline);
        if (left == 0 || (::poll(&p, 1, left) < 0 && errno != EINTR)) return false;
    }
    return true;
}

// An answer written without httplib: the head could not be read, or the server is full.
void answer_plain(int sock, int status, const char* reason, Clock::duration within) {
    const std::string body = fmt::format("{} {}\n", status, reason);
    const std::string text = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: "
        "close\r\n{}\r\n{}",
        status,
        reason,
        body.size(),
        status == 503 ? "Retry-After: 1\r\n" : "",
        body);
    send_all(sock, text.data(), text.size(), Clock::now() + within);
}

// Closes the connection so that the client gets the whole answer: closing a socket with unread input sends a reset
// that can overtake the answer, so the input still there (a body this server never reads) is drained first, waiting
// up to `linger` for more.
void close_after_answer(int sock, std::chrono::milliseconds linger) {
    ::shutdown(sock, SHUT_WR);
    const Clock::time_point deadline = Clock::now() + linger;
    char buf[4096];
    for (size_t drained = 0; drained < (64u << 10);) {
        const ssize_t n = ::recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            drained += static_cast<size_t>(n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
        pollfd p{sock, POLLIN, 0};
        const int left = millis_until(deadline);
        if (left == 0 || ::poll(&p, 1, left) <= 0) break;
    }
    ::close(sock);
}

enum class Head { complete, too_large, timed_out, gone };

// Reads the request head (up to the blank line) into `head`, which may also get the first bytes after it.
Head read_head(int sock, std::string& head, const std::atomic<bool>& shutting_down) {
    const Clock::time_point deadline = Clock::now() + BoundedHttpServer::kHeadDeadline;
    char buf[2048];
    for (;;) {
        if (shutting_down) return Head::gone;
        const int left = millis_until(deadline);
        if (left == 0) return Head::timed_out;
        pollfd p{sock, POLLIN, 0};
        const int ready = ::poll(&p, 1, std::min(left, 100));  // wakes to see a shutdown
        if (ready < 0 && errno != EINTR) return Head::gone;
        if (ready <= 0) continue;
        const size_t room = BoundedHttpServer::kMaxHeadBytes + 1 - head.size();
        const ssize_t n = ::recv(sock, buf, std::min(sizeof(buf), room), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (n <= 0) return Head::gone;
        head.append(buf, static_cast<size_t>(n));
        // A bare "\n\n" ends a head too, for httplib to refuse (it wants CRLF).
        for (const std::string_view end : {std::string_view("\r\n\r\n"), std::string_view("\n\n")}) {
            const size_t at = head.find(end);
            if (at != std::string::npos && at + end.size() <= BoundedHttpServer::kMaxHeadBytes) return Head::complete;
        }
        if (head.size() > BoundedHttpServer::kMaxHeadBytes) return Head::too_large;
    }
}

void endpoint_address(int sock, bool peer, std::string& ip, int& port) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    auto* sa = reinterpret_cast<sockaddr*>(&addr);
    if ((peer ? ::getpeername(sock, sa, &len) : ::getsockname(sock, sa, &len)) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
        ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
        port = ntohs(in->sin_port);
    } else if (addr.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
        ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
        port = ntohs(in6->sin6_port);
    }
    ip = text;
}

// httplib's view of one request: the head read from memory (then end of input: no body is read), the answer
// written to the socket with a deadline per write.
class HeadStream final : public httplib::Stream {
   public:
    HeadStream(int sock, std::string head) : sock_(sock), head_(std::move(head)) {}

    bool is_readable() const override {
        return pos_ < head_.size();
    }
    bool is_writable() const override {
        return !failed_;
    }
    ssize_t read(char* ptr, size_t size) override {
        const size_t n = std::min(size, head_.size() - pos_);
        std::memcpy(ptr, head_.data() + pos_, n);
        pos_ += n;
        return static_cast<ssize_t>(n);
    }
    ssize_t write(const char* ptr, size_t size) override {
        failed_ = failed_ || !send_all(sock_, ptr, size, Clock::now() + BoundedHttpServer::kWriteDeadline);
        return failed_ ? -1 : static_cast<ssize_t>(size);
    }
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        endpoint_address(sock_, /*peer=*/true, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        endpoint_address(sock_, /*peer=*/false, ip, port);
    }
    socket_t socket() const override {
        return sock_;
    }

   private:
    int sock_;
    std::string head_;
    size_t pos_ = 0;
    bool failed_ = false;
};

}  // namespace

std::unique_ptr<BoundedHttpServer> BoundedHttpServer::create() {
    // httplib's constructor sets SIGPIPE to ignored for the whole process; the training keeps its own disposition
    // (this server's sends use MSG_NOSIGNAL instead).
    struct sigaction saved {};
    ::sigaction(SIGPIPE, nullptr, &saved);
    std::unique_ptr<BoundedHttpServer> server(new BoundedHttpServer());
    ::sigaction(SIGPIPE, &saved, nullptr);
    return server;
}

BoundedHttpServer::BoundedHttpServer() {
    new_task_queue = [] { return new BoundedQueue(kWorkers, kMaxQueued); };
    set_keep_alive_max_count(1);
}

int BoundedHttpServer::bind_exclusive(const std::string& host, int port) {
    set_socket_options([](socket_t sock) {
        const int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    errno = 0;
    const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
    if (bound < 0) return -1;
    // httplib listens with a backlog of 5, so the kernel would drop a burst of connections before the accepting
    // thread sees them; listen() again raises it (Linux).
    ::listen(svr_sock_, kListenBacklog);
    return bound;
}

bool BoundedHttpServer::process_and_close_socket(socket_t sock) {
    if (t_refuse) {
        answer_plain(sock, 503, "Service Unavailable", std::chrono::milliseconds(50));
        close_after_answer(sock, std::chrono::milliseconds(0));
        return false;
    }
    std::string head;
    switch (read_head(sock, head, shutting_down_)) {
        case Head::complete:
            break;
        case Head::too_large:
            answer_plain(sock, 431, "Request Header Fields Too Large", kWriteDeadline);
            close_after_answer(sock, std::chrono::milliseconds(200));
            return false;
        case Head::timed_out:
            answer_plain(sock, 408, "Request Timeout", kWriteDeadline);
            close_after_answer(sock, std::chrono::milliseconds(0));
            return false;
        case Head::gone:
            ::close(sock);
            return false;
    }
    bool ok = false;
    try {
        HeadStream stream(sock, std::move(head));
        bool connection_closed = true;
        ok = process_request(stream, /*close_connection=*/true, connection_closed, nullptr);
    } catch (const std::exception&) {
        // Out of memory building an answer: this connection ends, the server and the training go on.
    }
    close_after_answer(sock, std::chrono::milliseconds(200));
    return ok;
}

}  // namespace mt::train
