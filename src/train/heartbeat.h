// The heartbeat of one rank (operations.md §1): `<run.dir>/heartbeat/rank_<r>.json`, rewritten whole (temp +
// rename) at each step end and, from a background thread, at least every `health.heartbeat_s` while a step runs, so
// that a supervisor can tell a slow step from a hung one and, from the phase, where a hung rank stopped:
//   {"rank", "host", "pid", "step", "phase": "data|forward|backward|optimizer|checkpoint|eval", "time",
//    "step_time_s"}
// step is the last completed step, time the unix seconds of the write, step_time_s the last step's seconds.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace mt::train {

enum class Phase : uint8_t { data, forward, backward, optimizer, checkpoint, eval };
const char* phase_name(Phase p);

class Heartbeat {
   public:
    // Creates `<run_dir>/heartbeat/` and writes the first beat (step `step`, phase data); exit 9 (io) naming the
    // path when it cannot. interval_s > 0.
    Heartbeat(const std::string& run_dir, int rank, int64_t step, double interval_s);
    ~Heartbeat();
    Heartbeat(const Heartbeat&) = delete;
    Heartbeat& operator=(const Heartbeat&) = delete;

    // What the rank does now (an atomic store: cheap enough for every micro-batch); the next beat reports it.
    void set_phase(Phase p) {
        phase_.store(p, std::memory_order_relaxed);
    }
    // Step `step` completed in `seconds`: a beat now.
    void step_end(int64_t step, double seconds);
    const std::string& path() const {
        return path_;
    }

   private:
    void beat();  // one write, serialised (the thread and step_end)
    void loop();

    std::string path_, host_;
    int rank_;
    double interval_s_;
    std::atomic<Phase> phase_{Phase::data};
    std::atomic<int64_t> step_;
    std::atomic<double> step_seconds_{0.0};
    std::mutex write_mutex_, wake_mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace mt::train
