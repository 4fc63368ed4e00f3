// Comm: the collective and point-to-point operations every parallel layout is built from (conventions §1.8), over
// raw buffers of a few element types, each returning a CommWork handle so communication can overlap compute.
// Backends: MPI (CPU buffers; also bootstraps every job, src/parallel/comm_mpi.cpp) and "self" (one process, no MPI
// calls, so `moetrain train` runs without mpirun) and NCCL (GPU buffers, src/parallel/comm_nccl.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/tensor.h"

namespace mt::parallel {

// Element types a Comm moves. u64 exists for histograms (QB counts) that core::DType does not name. bf16 and f16 are
// the GPU activations' (tensor parallelism's reductions of bf16 rows): NCCL reduces them; MPI moves them only as bytes
// (a reduction of them over MPI is an internal error: CPU training is f32 or f64).
enum class CommType : uint8_t { f32, f64, i32, i64, u64, u8, bf16, f16 };
enum class ReduceOp : uint8_t { sum, max, min };

size_t comm_type_size(CommType type);
// The CommType of a tensor dtype (f32, f64, bf16, f16, i32, i64, u8); other dtypes are an internal error.
CommType comm_type_of(core::DType dtype);

// Host seconds a communicator's operations held this process: inside its calls and inside the waits and polls of
// their handles (conventions §1.8 and §9: time per collective group). Shared by the communicator and its handles,
// since a handle may outlive its communicator. Intervals nest (NCCL's barrier waits on its own handle inside the
// call) and only the outermost one adds its time, so no interval counts twice. A Comm is used from one thread.
struct CommClock {
    double seconds = 0.0;
    int depth = 0;
};

// Adds the host time from its construction to its destruction to a clock (none when the clock is null). Two
// steady_clock reads: cheap beside any collective.
class [[nodiscard]] CommTimer {
   public:
    explicit CommTimer(CommClock* clock) : clock_(clock) {
        if (clock_ != nullptr && clock_->depth++ == 0) start_ = std::chrono::steady_clock::now();
    }
    ~CommTimer() {
        if (clock_ != nullptr && --clock_->depth == 0) clock_->seconds += core::seconds_since(start_);
    }
    CommTimer(const CommTimer&) = delete;
    CommTimer& operator=(const CommTimer&) = delete;

   private:
    CommClock* clock_;
    std::chrono::steady_clock::time_point start_{};
};

// A pending operation. wait() blocks until the buffers it was given may be read and reused; done() polls. A handle
// that is destroyed while pending waits first, so a dropped handle never leaves a backend writing into freed memory.
// wait_on_device() orders instead of blocking where the backend can: the ops' GPU stream waits for the operation
// (NCCL), so the host goes on queueing work that needs its result; host backends simply wait.
class CommWork {
   public:
    struct Impl {
        virtual ~Impl() = default;
        virtual void wait() = 0;
        virtual bool test() = 0;
        // Default: a host wait. A backend that returns without the operation being complete must make every later
        // launch on core::exec_stream() wait for it, and keep its buffers valid until then.
        virtual void wait_on_device() {
            wait();
        }
    };
    CommWork() = default;  // an already complete operation
    // clock: the issuing communicator's, which wait(), done() and wait_on_device() add their time to (Comm::handle).
    explicit CommWork(std::unique_ptr<Impl> impl, std::shared_ptr<CommClock> clock = nullptr)
        : impl_(std::move(impl)), clock_(std::move(clock)) {}
    CommWork(CommWork&&) noexcept = default;
    CommWork& operator=(CommWork&& other) noexcept;
    ~CommWork();

    void wait();
    bool done();
    void wait_on_device();

   private:
    std::unique_ptr<Impl> impl_;
    std::shared_ptr<CommClock> clock_;
};

// Operations a Comm counts (conventions §9: bytes and seconds per collective group).
enum class CommOp : uint8_t { all_reduce, reduce_scatter, all_gather, all_to_all_v, broadcast, send, recv, barrier };
constexpr int kCommOpCount = 8;
std::string_view comm_op_name(CommOp op);

struct CommOpStats {
    int64_t calls = 0;
    int64_t bytes = 0;  // bytes this rank sent (all-to-all, send) or contributed (reductions, gathers, broadcast)
};

// A communicator over a group of processes. Every collective must be called by every rank of the group in the
// same order, with matching counts. Buffers are host memory for the MPI and self backends. Counts are elements.
class Comm {
   public:
    virtual ~Comm() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string_view backend() const = 0;

    // In place: every rank's `data` becomes the reduction over the group.
    [[nodiscard]] virtual CommWork all_reduce(void* data, int64_t count, CommType type, ReduceOp op) = 0;
    // send holds size() * count elements; rank r receives the reduction of block r into recv (count elements).
    // send and recv must not overlap.
    [[nodiscard]] virtual CommWork reduce_scatter(
        const void* send, void* recv, int64_t count, CommType type, ReduceOp op) = 0;
    // Rank r's `count` elements land at recv + r * count on every rank. send may be exactly recv + rank() * count
    // (in place).
    [[nodiscard]] virtual CommWork all_gather(const void* send, void* recv, int64_t count, CommType type) = 0;
    // send_counts[r] elements go to rank r, packed in rank order in send; recv_counts[r] elements arrive from rank
    // r, packed in rank order in recv. Both spans have size() entries; the backend copies them, so they need not
    // outlive the call (the buffers must outlive the work).
    [[nodiscard]] virtual CommWork all_to_all_v(const void* send,
                                                std::span<const int64_t> send_counts,
                                                void* recv,
                                                std::span<const int64_t> recv_counts,
                                                CommType type) = 0;
    [[nodiscard]] virtual CommWork broadcast(void* data, int64_t count, CommType type, int root) = 0;
    [[nodiscard]] virtual CommWork send(const void* data, int64_t count, CommType type, int peer, int tag) = 0;
    [[nodiscard]] virtual CommWork recv(void* data, int64_t count, CommType type, int peer, int tag) = 0;
    virtual void barrier() = 0;
    // A new communicator per distinct color over this one's ranks, ordered by key (MPI_Comm_split). Collective.
    virtual std::unique_ptr<Comm> split(int color, int key) = 0;

    // Tensor forms: contiguous CPU tensors, dtype mapped by comm_type_of.
    [[nodiscard]] CommWork all_reduce(const core::Tensor& t, ReduceOp op = ReduceOp::sum);
    [[nodiscard]] CommWork reduce_scatter(const core::Tensor& send, const core::Tensor& recv, ReduceOp op);
    [[nodiscard]] CommWork all_gather(const core::Tensor& send, const core::Tensor& recv);
    [[nodiscard]] CommWork broadcast(const core::Tensor& t, int root);

    const CommOpStats& stats(CommOp op) const {
        return stats_[static_cast<size_t>(op)];
    }
    // Host seconds inside this communicator's operations and the waits on their handles (CommClock), all operations.
    double seconds() const {
        return clock_->seconds;
    }

   protected:
    // Counts an operation and times the rest of the caller's scope: `const CommTimer timed = record(op, bytes);` first
    // in every operation.
    CommTimer record(CommOp op, int64_t bytes) {
        auto& s = stats_[static_cast<size_t>(op)];
        ++s.calls;
        s.bytes += bytes;
        return CommTimer(clock_.get());
    }
    // The handle of an operation this communicator issued: its waits count in seconds().
    CommWork handle(std::unique_ptr<CommWork::Impl> impl) const {
        return CommWork(std::move(impl), clock_);
    }

   private:
    std::array<CommOpStats, kCommOpCount> stats_{};
    std::shared_ptr<CommClock> clock_ = std::make_shared<CommClock>();
};

// Blocking conveniences for the common scalar reductions (loss, token counts).
double comm_all_reduce_sum(Comm& comm, double value);
// Sums t (contiguous, any device) over a host communicator in place, copying a device tensor through the host: for
// the few small gradients the trainer sums over groups that have no NCCL communicator (the tied embedding's two
// pipeline copies, replicated key/value heads). Blocking.
void comm_all_reduce_through_host(Comm& comm, const core::Tensor& t);
int64_t comm_all_reduce_max(Comm& comm, int64_t value);
// Every rank's string, in rank order, on `root` (empty elsewhere). Collective.
std::vector<std::string> comm_gather_strings(Comm& comm, const std::string& mine, int root = 0);

// The one-process communicator: world size 1, no MPI calls.
std::unique_ptr<Comm> comm_make_self();

}  // namespace mt::parallel
