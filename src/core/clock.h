// Wall-clock durations for the timings the trainer and the communication layer report (steps, checkpoint phases,
// the supervisor's and elastic waits, the optimizer, collectives): steady_clock, so a clock change does not bend them.
#pragma once

#include <chrono>

namespace mt::core {

// Seconds from start to now.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mt::core
