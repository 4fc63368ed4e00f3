// Errors that say what and where: every failure is an mt::core::Error carrying an exit code
// (conventions §3), a message that names the file, field or tensor, and an optional hint.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mt::core {

// Exit codes from the conventions (§3), and two that moetrain adds (docs/training.md): 8, a graceful stop on
// SIGTERM or SIGINT after a checkpoint (resume with --resume; a scheduler may requeue on it), and 9, an I/O
// failure writing the run's output (metrics.jsonl: a full disk, a read-only file system).
enum class ExitCode : int {
    ok = 0,
    internal = 1,
    usage = 2,
    data = 3,
    checkpoint = 4,
    device = 5,
    distributed = 6,
    health = 7,
    stopped = 8,
    io = 9,
};

class Error : public std::runtime_error {
   public:
    Error(ExitCode code, std::string message, std::string hint = {})
        : std::runtime_error(message), code_(code), hint_(std::move(hint)) {}
    ExitCode code() const {
        return code_;
    }
    const std::string& hint() const {
        return hint_;
    }

   private:
    ExitCode code_;
    std::string hint_;
};

// Throws an Error with the given exit code; the message is fmt-formatted.
template <typename... Args>
[[noreturn]] void fail(ExitCode code, fmt::format_string<Args...> format, Args&&... args) {
    throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Same, with a hint line printed under the message.
template <typename... Args>
[[noreturn]] void fail_hint(ExitCode code,
                            const std::string& hint,
                            fmt::format_string<Args...> format,
                            Args&&... args) {
    throw Error(code, fmt::format(format, std::forward<Args>(args)...), hint);
}

[[noreturn]] void fail_check(const char* condition, const char* file, int line, const std::string& message);

}  // namespace mt::core

// Internal invariant: a failure is a bug in moetrain (or a caller) and exits with code 1 naming the source location.
#define MT_CHECK(cond, ...)                                                                         \
    do {                                                                                            \
        if (!(cond)) ::mt::core::fail_check(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    } while (0)

// Shape check: compares two integers and names both values.
#define MT_CHECK_SHAPE(a, b, what)                                                                                    \
    do {                                                                                                              \
        const auto mt_a_ = (a);                                                                                       \
        const auto mt_b_ = (b);                                                                                       \
        if (mt_a_ != mt_b_)                                                                                           \
            ::mt::core::fail_check(                                                                                   \
                #a " == " #b,                                                                                         \
                __FILE__,                                                                                             \
                __LINE__,                                                                                             \
                ::fmt::format("{}: {} != {}", (what), static_cast<long long>(mt_a_), static_cast<long long>(mt_b_))); \
    } while (0)
