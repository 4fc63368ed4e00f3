// Test helpers for the HTTP endpoint: raw exchanges over a socket (requests no well-behaved client would send), the
// status and body of an answer, and a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace mt::testing {

// A socket connected to 127.0.0.1:port (reads time out after `timeout_s`); -1 when the connection fails.
inline int http_connect(int port, int timeout_s = 10) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{timeout_s, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(s);
        return -1;
    }
    return s;
}

// Sends what it can of `data` (the server may stop reading and close: no SIGPIPE).
inline void http_send(int s, const std::string& data) {
    for (size_t done = 0; done < data.size();) {
        const ssize_t n = ::send(s, data.data() + done, data.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return;
        done += static_cast<size_t>(n);
    }
}

// Everything the server sends until it closes (or the read times out, or resets).
inline std::string http_receive(int s) {
    std::string out;
    char buf[4096];
    for (;;) {
        const ssize_t n = ::recv(s, buf, sizeof(buf), 0);
        if (n <= 0) return out;
        out.append(buf, static_cast<size_t>(n));
    }
}

// One raw exchange: connect, send `request` as is, read the answer.
inline std::string http_raw(int port, const std::string& request) {
    const int s = http_connect(port);
    if (s < 0) return "";
    http_send(s, request);
    std::string answer = http_receive(s);
    ::close(s);
    return answer;
}

// The status code of an answer ("HTTP/1.1 404 Not Found..." -> 404); 0 when there is none.
inline int http_status(const std::string& answer) {
    if (!answer.starts_with("HTTP/1.")) return 0;
    return std::atoi(answer.c_str() + 9);
}

inline std::string http_body(const std::string& answer) {
    const size_t end = answer.find("\r\n\r\n");
    return end == std::string::npos ? "" : answer.substr(end + 4);
}

// A loopback port nothing listens on now (the system's pick for a socket bound to port 0).
inline int http_free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(s);
    return ntohs(a.sin_port);
}

}  // namespace mt::testing
