// The run directory: checked and created (exit 2 naming run.dir when it cannot be), and held by one training at a
// time through an exclusive flock(2) on run.dir/.lock, so that a double launch or a scheduler requeue that overlaps
// the old job cannot interleave two runs' checkpoints, retention and metrics.
#pragma once

#include <string>

namespace mt::train {

// Creates run.dir (and its parents) when missing. Fails with exit 2 naming run.dir when it is empty, exists as
// something other than a directory, or cannot be created or written.
// @param[in] dir     run.dir
// @param[in] source  the config file, for the message
void run_dir_prepare(const std::string& dir, const std::string& source);

// Holds run.dir/.lock for its lifetime. The file records the holder ("pid=N\nhost=H\n"); a clean exit empties it.
// The kernel drops a flock when its holder dies, however it dies, so a lock whose holder is gone is simply taken
// (with a note naming the old holder when the file still names one). On a file system without flock support the
// run goes on unlocked, with a warning.
class RunLock {
   public:
    RunLock() = default;
    // Prepares the directory (run_dir_prepare) and takes the lock. A lock held by another process fails with exit 2
    // naming the directory and the PID and host that hold it.
    RunLock(const std::string& dir, const std::string& source);
    ~RunLock();
    RunLock(const RunLock&) = delete;
    RunLock& operator=(const RunLock&) = delete;
    RunLock(RunLock&& other) noexcept : fd_(other.fd_) {
        other.fd_ = -1;
    }
    RunLock& operator=(RunLock&& other) noexcept;

    bool held() const {
        return fd_ >= 0;
    }

   private:
    int fd_ = -1;
};

}  // namespace mt::train
