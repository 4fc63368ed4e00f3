// The background checkpoint writer: see async_checkpoint.h.
#include "train/async_checkpoint.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/clock.h"
#include "core/exec.h"
#include "parallel/comm.h"

namespace mt::train {

namespace {
constexpr int kWriterNice = 10;

// A snapshot buffer for a tensor of this shape and dtype on `device`: pinned host memory for a GPU tensor.
core::Tensor new_snapshot_buffer(const core::Shape& shape, core::DType dtype, core::Device device) {
    return device == core::Device::cpu ? core::Tensor::zeros(shape, dtype) : core::Tensor::zeros_pinned(shape, dtype);
}
}  // namespace

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
    stop_reserving_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    if (reservation_.joinable()) reservation_.join();
}

void AsyncCheckpointWriter::reserve_in_background(const std::vector<core::Tensor>& likes) {
    MT_CHECK(!in_flight() && !reservation_.joinable(), "AsyncCheckpointWriter::reserve_in_background twice");
    // Only the shapes, dtypes and devices go to the thread: it holds none of the state's tensors.
    struct Like {
        core::Shape shape;
        core::DType dtype;
        core::Device device;
    };
    std::vector<Like> wanted;
    wanted.reserve(likes.size());
    bool pinned = false;
    for (const core::Tensor& t : likes) {
        wanted.push_back({t.shape(), t.dtype(), t.device()});
        pinned = pinned || t.device() != core::Device::cpu;
    }
    // Pinned memory belongs to the caller's GPU; a CPU run must not make the thread open a context on one.
    const int device_index = pinned ? core::pinned_backend().thread_device_index() : -1;
    reservation_failure_.clear();
    reservation_ = std::thread([this, device_index, wanted = std::move(wanted)] {
        const auto start = std::chrono::steady_clock::now();
        try {
            if (device_index >= 0) core::pinned_backend().set_thread_device_index(device_index);
            for (size_t i = 0; i < wanted.size() && !stop_reserving_.load(std::memory_order_relaxed); ++i) {
                buffers_[i] = new_snapshot_buffer(wanted[i].shape, wanted[i].dtype, wanted[i].device);
            }
        } catch (const std::exception& e) {
            reservation_failure_ = e.what();
        }
        reservation_seconds_.store(core::seconds_since(start), std::memory_order_relaxed);
    });
}

void AsyncCheckpointWriter::join_reservation() {
    if (!reservation_.joinable()) return;
    const auto start = std::chrono::steady_clock::now();
    reservation_.join();
    reservation_wait_seconds_.store(core::seconds_since(start), std::memory_order_relaxed);
    if (!reservation_failure_.empty()) buffers_.clear();  // what was pinned before the failure goes back
}

const std::string& AsyncCheckpointWriter::reservation_failure() {
    join_reservation();
    return reservation_failure_;
}

core::Tensor& AsyncCheckpointWriter::buffer_for(size_t index, const core::Tensor& like) {
    join_reservation();
    core::Tensor& buffer = buffers_[index];
    if (!buffer.defined() || buffer.shape() != like.shape() || buffer.dtype() != like.dtype())
        buffer = new_snapshot_buffer(like.shape(), like.dtype(), like.device());
    return buffer;
}

core::Tensor AsyncCheckpointWriter::snapshot(size_t index, const core::Tensor& src) {
    MT_CHECK(!in_flight(), "AsyncCheckpointWriter::snapshot while a write is in flight");
    core::Tensor& buffer = buffer_for(index, src);
    if (src.device() == core::Device::cpu || !src.is_contiguous()) {
        buffer.copy_from(src);
        return buffer;
    }
    // A GPU tensor: copied on the copy lane, after everything the main lane has queued (the step that made it).
    core::Backend& backend = core::backend_get(src.device());
    if (!staging_) core::lane_wait(core::Lane::copy, core::Lane::main);
    staging_ = true;
    staged_device_ = src.device();
    core::ExecScope copy_lane({.lane = core::Lane::copy, .deterministic = core::exec().deterministic});
    backend.copy_async(buffer.raw(), core::Device::cpu, src.raw(), src.device(), src.nbytes());
    return buffer;
}

void AsyncCheckpointWriter::before_state_update() {
    if (!copies_pending_) return;
    core::lane_wait(core::Lane::main, core::Lane::copy);
    copies_pending_ = false;
}

void AsyncCheckpointWriter::start(const std::string& checkpoints_root,
                                  int64_t step,
                                  std::vector<CheckpointTensor> tensors,
                                  nlohmann::json manifest_extra,
                                  const RetentionPolicy& keep,
                                  parallel::Comm* comm) {
    MT_CHECK(!in_flight(), "AsyncCheckpointWriter::start while the write of step {} is in flight", step_);
    // The snapshots' copies: the thread waits for them before it reads the buffers, the main lane before the next
    // update of the state (before_state_update). Taken before anything that can throw, so that a failed start
    // leaves the next snapshots ordered after the main lane again.
    const core::Device device = staged_device_;
    const uint64_t copied = staging_ ? core::backend_get(device).lane_marker(core::Lane::copy) : 0;
    copies_pending_ = copies_pending_ || staging_;
    staging_ = false;
    std::string tmp_dir;
    try {
        tmp_dir = checkpoint_begin(checkpoints_root, step, comm);
    } catch (...) {
        core::backend_get(device).marker_wait(copied);
        throw;
    }
    root_ = checkpoints_root;
    step_ = step;
    extra_ = std::move(manifest_extra);
    keep_ = keep;
    comm_ = comm;
    error_ = nullptr;
    done_.store(false, std::memory_order_release);
    const int rank = comm != nullptr ? comm->rank() : 0;
    thread_ = std::thread([this, tmp_dir, rank, copied, device, tensors = std::move(tensors)] {
        const auto start = std::chrono::steady_clock::now();
#ifdef __linux__
        // Below the training threads in the scheduler's order (this thread only): a core the loop's OpenMP team
        // or its launching thread wants goes to them first, and the write takes what is left.
        ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
#endif
        try {
            core::backend_get(device).marker_wait(copied);
            part_ = checkpoint_write_rank_file(tmp_dir, rank, tensors);
        } catch (...) {
            error_ = std::current_exception();
        }
        write_seconds_ = core::seconds_since(start);
        done_.store(true, std::memory_order_release);
    });
}

std::string AsyncCheckpointWriter::finish() {
    MT_CHECK(in_flight(), "AsyncCheckpointWriter::finish with no write in flight");
    const auto start = std::chrono::steady_clock::now();
    thread_.join();
    // Every rank learns whether all files are in before any goes on to the manifest, so that a failed write on one
    // rank fails them all instead of leaving the others waiting in the gather.
    const bool failed = error_ != nullptr;
    const bool any_failed = comm_ != nullptr && comm_->size() > 1
                                ? parallel::comm_all_reduce_max(*comm_, int64_t{failed ? 1 : 0}) != 0
                                : failed;
    if (failed) std::rethrow_exception(std::exchange(error_, nullptr));
    if (any_failed)
        core::fail(core::ExitCode::checkpoint,
                   "the checkpoint of step {} failed on another rank (its message says why) [{}]",
                   step_,
                   root_);
    // The manifest, the rename and the retention run here, on the loop's thread: part of its wait.
    std::string dir = checkpoint_finish(root_, step_, part_, extra_, keep_, comm_);
    wait_seconds_ = core::seconds_since(start);
    return dir;
}

}  // namespace mt::train
