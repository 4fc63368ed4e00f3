// Signal handlers. Everything a handler does is async-signal-safe: write(2), backtrace into a preloaded unwinder,
// atomics, siglongjmp back into the guarded read and _exit. Messages are assembled at install time where they can.
#include "core/signals.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace mt::core {

namespace {

// A map that a SIGBUS may hit. begin == nullptr marks a free slot.
struct MapSlot {
    std::atomic<const uint8_t*> begin{nullptr};
    size_t size = 0;
    const char* path = nullptr;
    int code = 0;
};
constexpr int kMapSlots = 8192;
std::array<MapSlot, kMapSlots> g_maps;
std::atomic<int> g_map_high{0};  // slots [0, high) may be in use
std::mutex g_map_mutex;

std::atomic<int> g_stop_signal{0};
bool g_announce_stop = false;
char g_rank_prefix[32] = "";  // "[rank 3] " under MPI
alignas(16) char g_alt_stack[64 * 1024];

// Appends text to a fixed buffer (handlers cannot allocate).
struct Line {
    char text[1024];
    size_t n = 0;
    void add(const char* s) {
        while (*s != '\0' && n + 1 < sizeof(text)) text[n++] = *s++;
    }
    void add_hex(uintptr_t v) {
        char digits[2 + 2 * sizeof(v) + 1] = "0x";
        int k = 2;
        bool started = false;
        for (int shift = 8 * static_cast<int>(sizeof(v)) - 4; shift >= 0; shift -= 4) {
            const int d = static_cast<int>((v >> shift) & 0xF);
            if (d != 0 || started || shift == 0) {
                digits[k++] = "0123456789abcdef"[d];
                started = true;
            }
        }
        digits[k] = '\0';
        add(digits);
    }
    void add_dec(long v) {
        char digits[24];
        int k = 0;
        const bool negative = v < 0;
        unsigned long u = negative ? 0UL - static_cast<unsigned long>(v) : static_cast<unsigned long>(v);
        do {
            digits[k++] = static_cast<char>('0' + u % 10);
            u /= 10;
        } while (u != 0 && k < 22);
        if (negative) digits[k++] = '-';
        while (k > 0 && n + 1 < sizeof(text)) text[n++] = digits[--k];
    }
    void flush() const {
        ssize_t ignored = ::write(STDERR_FILENO, text, n);
        (void)ignored;
    }
};

const char* signal_short_name(int sig) {
    switch (sig) {
        case SIGSEGV:
            return "SIGSEGV";
        case SIGBUS:
            return "SIGBUS";
        case SIGFPE:
            return "SIGFPE";
        case SIGILL:
            return "SIGILL";
        case SIGTERM:
            return "SIGTERM";
        case SIGINT:
            return "SIGINT";
        default:
            return nullptr;
    }
}

int find_map(const void* addr) {
    const auto* a = static_cast<const uint8_t*>(addr);
    const int high = g_map_high.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        const uint8_t* begin = g_maps[i].begin.load(std::memory_order_acquire);
        if (begin != nullptr && a >= begin && a < begin + g_maps[i].size) return i;
    }
    return -1;
}

void on_fatal_signal(int sig, siginfo_t* info, void*) {
    if (sig == SIGBUS) {
        const int slot = find_map(info->si_addr);
        if (slot >= 0) {
            if (MappedReadGuard* guard = signals_guard_top()) {
                guard->slot = slot;
                siglongjmp(guard->env, 1);
            }
            Line line;
            line.add("moetrain: error: ");
            line.add(g_rank_prefix);
            line.add("the file was truncated or overwritten in place while it was mapped (SIGBUS) [");
            line.add(g_maps[slot].path);
            line.add(
                "]\n  HINT: never change a data or checkpoint file that a run is using; restore it and resume "
                "with --resume\n");
            line.flush();
            _exit(g_maps[slot].code);
        }
    }
    Line line;
    line.add("moetrain: error: ");
    line.add(g_rank_prefix);
    line.add("fatal signal ");
    const char* name = signal_short_name(sig);
    line.add(name != nullptr ? name : "?");
    if (info->si_code <= 0) {  // kill(2), raise(3): there is no faulting address, only a sender
        line.add(" (sent by process ");
        line.add_dec(info->si_pid);
        line.add(")");
    } else {
        line.add(" at address ");
        line.add_hex(reinterpret_cast<uintptr_t>(info->si_addr));
    }
    line.add(": an internal bug; backtrace (`addr2line -Cfe BINARY +OFFSET` names the frames):\n");
    line.flush();
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

void on_stop_signal(int sig) {
    int expected = 0;
    if (!g_stop_signal.compare_exchange_strong(expected, sig)) {
        // The second signal: the default action now, which ends the process as if no handler were installed.
        std::signal(sig, SIG_DFL);
        std::raise(sig);
        return;
    }
    if (!g_announce_stop) return;
    Line line;
    line.add("moetrain: ");
    line.add(signal_short_name(sig));
    line.add(" received: stopping after the current step with a checkpoint (send it again to stop at once)\n");
    line.flush();
}

}  // namespace

MappedReadGuard*& signals_guard_top() {
    thread_local MappedReadGuard* top = nullptr;
    return top;
}

void signals_guard_fail(int slot) {
    const MapSlot& m = g_maps[static_cast<size_t>(slot)];
    fail_hint(static_cast<ExitCode>(m.code),
              "never change a data or checkpoint file that a run is using; restore it and resume with --resume",
              "the file was truncated or overwritten in place while it was being read (SIGBUS) [{}]",
              m.path);
}

void signals_install_fatal(int rank) {
    if (rank >= 0) std::snprintf(g_rank_prefix, sizeof(g_rank_prefix), "[rank %d] ", rank);
    void* warm[1];
    (void)backtrace(warm, 1);   // loads libgcc's unwinder now, not inside the handler
    (void)signals_guard_top();  // and this thread's guard slot
    // Its own stack, so that a stack overflow (SIGSEGV) still prints.
    stack_t alt{};
    alt.ss_sp = g_alt_stack;
    alt.ss_size = sizeof(g_alt_stack);
    sigaltstack(&alt, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

void signals_install_stop(bool announce) {
    g_announce_stop = announce;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;  // the I/O in flight carries on; the loop polls the flag
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

int signals_stop_requested() {
    return g_stop_signal.load(std::memory_order_relaxed);
}

std::string signal_name(int sig) {
    const char* name = signal_short_name(sig);
    return name != nullptr ? std::string(name) : fmt::format("signal {}", sig);
}

int signals_map_register(const void* begin, size_t size, const char* path, ExitCode code) {
    if (begin == nullptr || size == 0) return -1;
    std::lock_guard<std::mutex> lock(g_map_mutex);
    for (int i = 0; i < kMapSlots; ++i) {
        if (g_maps[i].begin.load(std::memory_order_relaxed) != nullptr) continue;
        g_maps[i].size = size;
        g_maps[i].path = path;
        g_maps[i].code = static_cast<int>(code);
        g_maps[i].begin.store(static_cast<const uint8_t*>(begin), std::memory_order_release);
        if (i >= g_map_high.load(std::memory_order_relaxed)) g_map_high.store(i + 1, std::memory_order_release);
        return i;
    }
    return -1;
}

void signals_map_unregister(int slot) {
    if (slot < 0 || slot >= kMapSlots) return;
    std::lock_guard<std::mutex> lock(g_map_mutex);
    g_maps[static_cast<size_t>(slot)].begin.store(nullptr, std::memory_order_release);
}

}  // namespace mt::core
