// Signals: a banner with a backtrace for fatal ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL) in every run, a stop flag
// for SIGTERM and SIGINT (a graceful stop after the current step; a second signal stops at once), and SIGBUS on a
// memory-mapped file that shrank or was overwritten under us turned into an Error naming the file.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <string>

#include "core/error.h"

namespace mt::core {

// Installs the fatal-signal handlers: "moetrain: error: [rank R] fatal signal SIGSEGV ..." and the raw frames on
// stderr, then death by the same signal. A SIGBUS inside a registered map (signals_map_register) instead names the
// file and ends the process with the map's exit code, or becomes an Error inside signals_guard_mapped_reads.
// @param[in] rank  the world rank for the prefix; < 0 for a single process (no prefix)
void signals_install_fatal(int rank);

// Installs the SIGTERM/SIGINT handlers: the first signal only sets the stop flag (and says so on stderr when
// `announce`), a second one restores the default action and re-raises, so the process dies at once.
void signals_install_stop(bool announce);
// The stop signal received (SIGTERM, SIGINT), 0 when none.
int signals_stop_requested();
// "SIGTERM" for SIGTERM, "signal N" for a signal without a name here.
std::string signal_name(int sig);

// Registers [begin, begin + size) as a read-only map of the file `path` (the pointer must stay valid until
// signals_map_unregister), so that a SIGBUS there names the file and ends with `code`. Returns the slot (-1 when
// the table is full: the map then gets the plain fatal banner).
int signals_map_register(const void* begin, size_t size, const char* path, ExitCode code);
void signals_map_unregister(int slot);

// One armed recovery point of signals_guard_mapped_reads (internal; per thread, nested guards chain).
struct MappedReadGuard {
    sigjmp_buf env;
    MappedReadGuard* prev = nullptr;
    volatile int slot = -1;
};
MappedReadGuard*& signals_guard_top();
[[noreturn]] void signals_guard_fail(int slot);

// Runs fn; a SIGBUS on a registered map while it runs becomes an Error with the map's exit code naming the file.
// fn must hold no objects with non-trivial destructors of its own between the guard and the read (the recovery
// jumps over its frames), which plain copy loops over mapped bytes satisfy. Exceptions thrown by fn pass through.
template <typename Fn>
void signals_guard_mapped_reads(Fn&& fn) {
    MappedReadGuard guard;
    guard.prev = signals_guard_top();
    if (sigsetjmp(guard.env, 1) != 0) {
        signals_guard_top() = guard.prev;
        signals_guard_fail(guard.slot);
    }
    signals_guard_top() = &guard;
    try {
        fn();
    } catch (...) {
        signals_guard_top() = guard.prev;
        throw;
    }
    signals_guard_top() = guard.prev;
}

}  // namespace mt::core
