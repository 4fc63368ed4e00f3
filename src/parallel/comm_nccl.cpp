// The NCCL backend of Comm (comm_nccl.h): NCCL collectives on the communicator's own CUDA stream, each followed by
// a CUDA event that its CommWork polls. Compiled only with MT_HAVE_NCCL (CMake found nccl.h and libnccl); other
// builds get comm_nccl_stub.cpp.
#ifdef MT_HAVE_NCCL
#include "parallel/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "parallel/runtime.h"

namespace mt::parallel {

namespace {

ncclDataType_t nccl_type(CommType type) {
    switch (type) {
        case CommType::f32:
            return ncclFloat32;
        case CommType::f64:
            return ncclFloat64;
        case CommType::i32:
            return ncclInt32;
        case CommType::i64:
            return ncclInt64;
        case CommType::u64:
            return ncclUint64;
        case CommType::u8:
            return ncclUint8;
        case CommType::bf16:
            return ncclBfloat16;
        case CommType::f16:
            return ncclFloat16;
    }
    return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return ncclSum;
        case ReduceOp::max:
            return ncclMax;
        case ReduceOp::min:
            return ncclMin;
    }
    return ncclSum;
}

// As the MPI backend: a failed call becomes an Error (exit 6) naming it, with NCCL's text and its last detailed
// message (which says e.g. which peer or transport failed), instead of an abort without context.
void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return;
    const char* detail = ncclGetLastError(nullptr);
    core::fail(core::ExitCode::distributed,
               "{} failed: {}{}{}",
               call,
               ncclGetErrorString(rc),
               detail != nullptr && *detail != '\0' ? ": " : "",
               detail != nullptr ? detail : "");
}

// A host thread that polls every live communicator for NCCL's asynchronous errors twice a second, as
// torch.distributed's watchdog does. GPU work can wait on a collective without the host polling it
// (CommWork::wait_on_device, then a device synchronisation such as the loss read-back); if that collective failed,
// the rank would block in the driver forever. The watchdog prints the error and ends the process with exit 6, and
// the launcher then ends the other ranks. (A handle's own polling reports the same error first when the host waits.)
class Watchdog {
   public:
    static Watchdog& get() {
        static Watchdog watchdog;
        return watchdog;
    }
    void add(ncclComm_t comm) {
        const std::lock_guard<std::mutex> lock(mutex_);
        comms_.push_back(comm);
    }
    // Before the communicator is destroyed: the poll holds the lock, so it never reads a destroyed one.
    void remove(ncclComm_t comm) {
        const std::lock_guard<std::mutex> lock(mutex_);
        comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
    }
    ~Watchdog() {
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

   private:
    Watchdog() : rank_(dist_world().rank()), thread_([this] { run(); }) {}
    void run() {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) {
            for (ncclComm_t comm : comms_) {
                ncclResult_t async = ncclSuccess;
                if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess ||
                    async == ncclInProgress)
                    continue;
                const char* detail = ncclGetLastError(comm);
                std::fprintf(stderr,
                             "moetrain: error: [rank %d] an NCCL operation in flight failed (asynchronous error): "
                             "%s%s%s\n",
                             rank_,
                             ncclGetErrorString(async),
                             detail != nullptr && *detail != '\0' ? ": " : "",
                             detail != nullptr ? detail : "");
                std::fflush(stderr);
                std::_Exit(static_cast<int>(core::ExitCode::distributed));
            }
        }
    }

    const int rank_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<ncclComm_t> comms_;
    bool stop_ = false;
    std::thread thread_;  // last: starts after the members it reads
};

class NcclComm;

// One launch on a communicator's stream (an operation, or a batch of sends and receives) and the CUDA event recorded
// after it. Shared by the handles of a batch; `owner` is set while the batch still waits to be issued.
struct Launch {
    cudaEvent_t event = nullptr;
    ncclComm_t comm = nullptr;  // polled for asynchronous errors while the event is pending
    NcclComm* owner = nullptr;
    explicit Launch(ncclComm_t c) : comm(c) {
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    ~Launch() {
        if (event != nullptr) cudaEventDestroy(event);
    }
};

// Polls the event rather than blocking in cudaEventSynchronize, so an NCCL failure on another rank (reported
// asynchronously by ncclCommGetAsyncError) ends this rank with exit 6 instead of a hang. A communicator
// synchronises its stream before it is destroyed, so a handle that outlives it finds its event complete and never
// reads the freed ncclComm_t.
struct NcclWork final : CommWork::Impl {
    std::shared_ptr<Launch> launch;
    explicit NcclWork(std::shared_ptr<Launch> l) : launch(std::move(l)) {}
    void wait() override {
        while (!test()) std::this_thread::yield();
    }
    bool test() override;
    // The ops' stream waits for the launch's event; the event outlives this handle until the GPU has passed it
    // (cudaEventDestroy defers the release of a pending event).
    void wait_on_device() override;
};

class NcclComm final : public Comm {
   public:
    NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {
        check(ncclCommCount(comm_, &size_), "ncclCommCount");
        check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
        MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
        MT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
        MT_CUDA_CHECK(cudaMemset(scratch_, 0, sizeof(int32_t)));
        Watchdog::get().add(comm_);
    }
    ~NcclComm() override {
        // Issue a batch still waiting and let every launch finish before freeing (see NcclWork). Errors here have
        // nowhere to go: the job is ending or already failing.
        try {
            if (batch_) issue_batch();
        } catch (const std::exception&) {
        }
        cudaStreamSynchronize(stream_);
        Watchdog::get().remove(comm_);
        ncclCommDestroy(comm_);
        cudaFree(scratch_);
        cudaEventDestroy(compute_done_);
        cudaStreamDestroy(stream_);
    }
    int rank() const override {
        return rank_;
    }
    int size() const override {
        return size_;
    }
    std::string_view backend() const override {
        return "nccl";
    }

    CommWork all_reduce(void* data, int64_t count, CommType type, ReduceOp op) override {
        const CommTimer timed = record(CommOp::all_reduce, bytes(count, type));
        begin();
        check(ncclAllReduce(data, data, n(count), nccl_type(type), nccl_op(op), comm_, stream_), "ncclAllReduce");
        return finish();
    }

    CommWork reduce_scatter(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) override {
        const CommTimer timed = record(CommOp::reduce_scatter, bytes(count * size_, type));
        begin();
        check(ncclReduceScatter(send, recv, n(count), nccl_type(type), nccl_op(op), comm_, stream_),
              "ncclReduceScatter");
        return finish();
    }

    // NCCL treats send == recv + rank * count as in place by itself.
    CommWork all_gather(const void* send, void* recv, int64_t count, CommType type) override {
        const CommTimer timed = record(CommOp::all_gather, bytes(count, type));
        begin();
        check(ncclAllGather(send, recv, n(count), nccl_type(type), comm_, stream_), "ncclAllGather");
        return finish();
    }

    // NCCL has no all-to-all-v: one group of a send and a receive per peer (self included, as nccl-tests and
    // torch.distributed do), at packed offsets.
    CommWork all_to_all_v(const void* send,
                          std::span<const int64_t> send_counts,
                          void* recv,
                          std::span<const int64_t> recv_counts,
                          CommType type) override {
        MT_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
                 "all_to_all_v: counts need one entry per rank ({} ranks)",
                 size_);
        int64_t s_total = 0;
        for (int64_t c : send_counts) s_total += c;
        const CommTimer timed = record(CommOp::all_to_all_v, bytes(s_total, type));
        begin();
        const auto* s = static_cast<const char*>(send);
        auto* r = static_cast<char*>(recv);
        int64_t s_at = 0, r_at = 0;
        check(ncclGroupStart(), "ncclGroupStart");
        for (int p = 0; p < size_; ++p) {
            const int64_t sc = send_counts[static_cast<size_t>(p)], rc = recv_counts[static_cast<size_t>(p)];
            MT_CHECK(sc >= 0 && rc >= 0, "all_to_all_v: negative count for rank {}", p);
            // A zero count on one side is a zero count on the other (the counts match), so both skip the pair.
            if (sc > 0) check(ncclSend(s + bytes(s_at, type), n(sc), nccl_type(type), p, comm_, stream_), "ncclSend");
            if (rc > 0) check(ncclRecv(r + bytes(r_at, type), n(rc), nccl_type(type), p, comm_, stream_), "ncclRecv");
            s_at += sc;
            r_at += rc;
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        return finish();
    }

    CommWork broadcast(void* data, int64_t count, CommType type, int root) override {
        MT_CHECK(root >= 0 && root < size_, "broadcast root {} outside {} ranks", root, size_);
        const CommTimer timed = record(CommOp::broadcast, bytes(count, type));
        begin();
        check(ncclBroadcast(data, data, n(count), nccl_type(type), root, comm_, stream_), "ncclBroadcast");
        return finish();
    }

    CommWork send(const void* data, int64_t count, CommType type, int peer, int tag) override {
        const P2p op{true, const_cast<void*>(data), n(count), nccl_type(type), checked_peer(peer, "send")};
        const CommTimer timed = record(CommOp::send, bytes(count, type));
        return queue(op);
    }

    CommWork recv(void* data, int64_t count, CommType type, int peer, int tag) override {
        const P2p op{false, data, n(count), nccl_type(type), checked_peer(peer, "recv")};
        const CommTimer timed = record(CommOp::recv, bytes(count, type));
        return queue(op);
    }

    // A one-element all-reduce, then the host waits for it: every rank has reached the barrier (and the GPU work
    // queued before it on the ops' stream is done).
    void barrier() override {
        const CommTimer timed = record(CommOp::barrier, 0);
        begin();
        check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
        finish().wait();
    }

    std::unique_ptr<Comm> split(int color, int key) override {
        MT_CHECK(color >= 0, "the NCCL communicator's split needs color >= 0 (got {})", color);
        if (batch_) issue_batch();
        ncclComm_t sub = nullptr;
        check(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
        return std::make_unique<NcclComm>(sub, device_);
    }

    // Issues the queued sends and receives as one group (called by the next operation, a handle of the batch, or
    // the destructor).
    void issue_batch() {
        const std::shared_ptr<Launch> batch = std::move(batch_);
        const std::vector<P2p> ops = std::move(p2p_);
        batch_.reset();
        p2p_.clear();
        batch->owner = nullptr;
        follow_compute();
        check(ncclGroupStart(), "ncclGroupStart");
        for (const P2p& op : ops) {
            if (op.is_send)
                check(ncclSend(op.data, op.count, op.type, op.peer, comm_, stream_), "ncclSend");
            else
                check(ncclRecv(op.data, op.count, op.type, op.peer, comm_, stream_), "ncclRecv");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        MT_CUDA_CHECK(cudaEventRecord(batch->event, stream_));
    }

   private:
    struct P2p {
        bool is_send;
        void* data;
        size_t count;
        ncclDataType_t type;
        int peer;
    };

    static int64_t bytes(int64_t count, CommType type) {
        return count * static_cast<int64_t>(comm_type_size(type));
    }
    static size_t n(int64_t count) {
        MT_CHECK(count >= 0, "negative element count {}", count);
        return static_cast<size_t>(count);
    }
    int checked_peer(int peer, const char* what) const {
        MT_CHECK(peer >= 0 && peer < size_ && peer != rank_,
                 "{} to rank {}: the NCCL communicator has ranks 0..{} and this is rank {}",
                 what,
                 peer,
                 size_ - 1,
                 rank_);
        return peer;
    }

    // Makes the communicator's stream wait (on the GPU) for the work queued so far on the ops' stream, which
    // produced the buffers; a later operation cannot start before an earlier one on this stream has finished.
    void follow_compute() {
        MT_CUDA_CHECK(cudaEventRecord(compute_done_, core::exec_stream()));
        MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
    }
    // Before a collective: queued sends and receives go first, as they were called first.
    void begin() {
        if (batch_) issue_batch();
        follow_compute();
    }
    CommWork finish() {
        auto launch = std::make_shared<Launch>(comm_);
        MT_CUDA_CHECK(cudaEventRecord(launch->event, stream_));
        return handle(std::make_unique<NcclWork>(std::move(launch)));
    }
    CommWork queue(const P2p& op) {
        if (!batch_) {
            batch_ = std::make_shared<Launch>(comm_);
            batch_->owner = this;
        }
        p2p_.push_back(op);
        return handle(std::make_unique<NcclWork>(batch_));
    }

    ncclComm_t comm_ = nullptr;
    int device_ = 0, rank_ = 0, size_ = 1;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t compute_done_ = nullptr;
    int32_t* scratch_ = nullptr;     // the barrier's one element
    std::vector<P2p> p2p_;           // sends and receives not yet issued
    std::shared_ptr<Launch> batch_;  // their shared launch
};

bool NcclWork::test() {
    if (launch->owner != nullptr) launch->owner->issue_batch();
    const cudaError_t err = cudaEventQuery(launch->event);
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) MT_CUDA_CHECK(err);
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(launch->comm, &async), "ncclCommGetAsyncError");
    check(async, "an NCCL operation in flight (asynchronous error)");
    return false;
}

void NcclWork::wait_on_device() {
    if (launch->owner != nullptr) launch->owner->issue_batch();
    MT_CUDA_CHECK(cudaStreamWaitEvent(core::exec_stream(), launch->event, 0));
}

}  // namespace

bool comm_nccl_compiled() {
    return true;
}

int comm_nccl_local_device() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return -1;
    }
    int local = -1;
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"}) {
        if (const char* value = std::getenv(var)) {
            local = std::atoi(value);
            break;
        }
    }
    if (local < 0) local = dist_world().rank();
    return local % count;
}

std::unique_ptr<Comm> comm_make_nccl(Comm& bootstrap) {
    const int device = comm_nccl_local_device();
    if (device < 0)
        core::fail_hint(core::ExitCode::device,
                        "run GPU jobs where every rank sees a GPU (check CUDA_VISIBLE_DEVICES)",
                        "the NCCL communicator needs a CUDA device, and rank {} sees none",
                        bootstrap.rank());
    MT_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(&id, static_cast<int64_t>(sizeof(id)), CommType::u8, 0).wait();
    ncclComm_t comm = nullptr;
    check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
    return std::make_unique<NcclComm>(comm, device);
}

}  // namespace mt::parallel
#endif
