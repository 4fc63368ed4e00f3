// Asynchronous checkpoints (operations.md, docs/operations.md "Asynchronous checkpoints"): at the step boundary the
// training thread copies the state into snapshot buffers (pinned host memory for GPU tensors, reused from one
// checkpoint to the next), rank 0 makes the temp directory, and a background thread writes this rank's file while
// training goes on. The manifest, DONE and the rename come later on the training thread (they talk to the other
// ranks): the write stays atomic, and a process killed mid-write leaves only a *.tmp directory that resume ignores.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint_io.h"

namespace mt::parallel {
class Comm;
}

namespace mt::train {

class AsyncCheckpointWriter {
   public:
    AsyncCheckpointWriter() = default;
    ~AsyncCheckpointWriter();  // joins a write still running (its directory stays *.tmp)
    AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
    AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

    // A copy of src in the snapshot buffer for tensor `index` of the next checkpoint (allocated on first use and
    // whenever the shape or dtype changes; pinned when src is on a GPU). Only between writes (no write in flight).
    // A GPU tensor's copy is queued on the copy lane (core/exec.h) after the main lane's work so far and returns at
    // once: the training steps that follow run beside it, the background thread waits for it before writing, and
    // before_state_update() orders the main lane after it.
    core::Tensor snapshot(size_t index, const core::Tensor& src);
    // Allocates the buffers snapshot(i, likes[i]) would use, without copying, on a thread of its own: the trainer
    // reserves every buffer when the run starts, so that no checkpoint pays for allocating (and pinning) a copy of
    // the state, and pinning a GPU run's copy (31 GB for kimi_linear_mini, 12 s) runs beside the start, the resume's
    // load and the first steps instead of before them. Everything that touches the buffers (snapshot, the
    // destructor) waits for it first.
    void reserve_in_background(const std::vector<core::Tensor>& likes);
    // Waits for that reservation; empty when it succeeded (or there was none), else why it failed (the host's
    // memory, say): the trainer then writes its checkpoints blocking, through ordinary memory, instead of failing
    // the run at its first checkpoint.
    const std::string& reservation_failure();
    // Called before anything changes the state the last snapshots copied (the optimizer's update, the balancers'):
    // the main lane's work from here on waits for those copies on the GPU; the host does not wait. Nothing on the
    // CPU (its copies are done when snapshot returns).
    void before_state_update();

    // Collective over comm (checkpoint_begin), then this rank's file on the background thread. The tensors must be
    // snapshots (nothing the training thread changes). At most one write in flight.
    void start(const std::string& checkpoints_root,
               int64_t step,
               std::vector<CheckpointTensor> tensors,
               nlohmann::json manifest_extra,
               const RetentionPolicy& keep,
               parallel::Comm* comm);
    bool in_flight() const {
        return thread_.joinable();
    }
    // This rank's file is written (or its write failed): finish() will not wait for the thread.
    bool file_done() const {
        return done_.load(std::memory_order_acquire);
    }
    // Collective over the start's comm: waits for this rank's file (a failed write is rethrown: exit 4 or 9 naming
    // the file), then the manifest, DONE, the rename and retention. Returns the checkpoint directory.
    std::string finish();
    int64_t step() const {
        return step_;
    }
    // Seconds the background thread spent writing this rank's file, and the last finish() took on the caller's
    // thread (the wait for that file, then the manifest, the rename and the retention).
    double write_seconds() const {
        return write_seconds_;
    }
    double wait_seconds() const {
        return wait_seconds_;
    }
    // The background reservation's wall time (0 until it ends), and how long the caller's thread waited for it (0
    // when it had ended before the first snapshot).
    double reservation_seconds() const {
        return reservation_seconds_.load(std::memory_order_relaxed);
    }
    double reservation_wait_seconds() const {
        return reservation_wait_seconds_.load(std::memory_order_relaxed);
    }

   private:
    core::Tensor& buffer_for(size_t index, const core::Tensor& like);
    void join_reservation();  // waits for reserve_in_background's thread; rethrows its error

    std::map<size_t, core::Tensor> buffers_;
    std::thread reservation_;
    std::atomic<bool> stop_reserving_{false};  // the destructor's: the buffers left are not needed
    std::string reservation_failure_;          // the thread's error message; read after the join
    std::atomic<double> reservation_seconds_{0.0}, reservation_wait_seconds_{0.0};
    // Copies queued on the copy lane since the last start() (staging_), and since then not yet ordered before the
    // main lane (copies_pending_), of tensors on staged_device_.
    bool staging_ = false, copies_pending_ = false;
    core::Device staged_device_ = core::Device::cpu;
    std::thread thread_;
    std::atomic<bool> done_{false};
    std::exception_ptr error_;
    nlohmann::json part_;
    std::string root_;
    int64_t step_ = -1;
    nlohmann::json extra_;
    RetentionPolicy keep_;
    parallel::Comm* comm_ = nullptr;
    double write_seconds_ = 0.0, wait_seconds_ = 0.0;
};

}  // namespace mt::train
