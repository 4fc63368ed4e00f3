// The MPI backend of Comm: MPI-3 nonblocking collectives (MPI_Iallreduce, ...) over host buffers, so a CommWork is
// a set of MPI requests. MPI counts are int, so large reductions and broadcasts are issued in chunks; the
// other collectives check that their counts fit.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "parallel/comm.h"
#include "parallel/runtime.h"

namespace mt::parallel {

namespace {

// Chunk size for operations that are split into several MPI calls (elements).
constexpr int64_t kMaxChunk = int64_t{1} << 30;

MPI_Datatype mpi_type(CommType type) {
    switch (type) {
        case CommType::f32:
            return MPI_FLOAT;
        case CommType::f64:
            return MPI_DOUBLE;
        case CommType::i32:
            return MPI_INT32_T;
        case CommType::i64:
            return MPI_INT64_T;
        case CommType::u64:
            return MPI_UINT64_T;
        case CommType::u8:
            return MPI_UINT8_T;
        case CommType::bf16:
        case CommType::f16:
            // MPI has no half types: moving them as bytes is a gather's business (CommType::u8); a reduction of half
            // values over MPI would sum their bit patterns.
            MT_CHECK(false, "MPI has no 16-bit float type: reduce half-precision values over NCCL");
    }
    return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return MPI_SUM;
        case ReduceOp::max:
            return MPI_MAX;
        case ReduceOp::min:
            return MPI_MIN;
    }
    return MPI_SUM;
}

// MPI's error handler on our communicators is MPI_ERRORS_RETURN, so a failure becomes an Error (exit 6) naming the
// call instead of an abort without context.
void check(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    core::fail(core::ExitCode::distributed, "{} failed: {}", call, std::string(text, static_cast<size_t>(len)));
}

int to_int(int64_t n, const char* what) {
    MT_CHECK(n >= 0 && n <= INT_MAX, "{}: {} elements exceed MPI's int count", what, n);
    return static_cast<int>(n);
}

// The requests of one operation, plus the count arrays all-to-all-v needs alive until it completes.
struct MpiWork final : CommWork::Impl {
    std::vector<MPI_Request> requests;
    std::vector<int> counts;
    void wait() override {
        check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
        requests.clear();
    }
    bool test() override {
        int flag = 0;
        check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
        if (flag) requests.clear();
        return flag != 0;
    }
};

class MpiComm final : public Comm {
   public:
    explicit MpiComm(MPI_Comm comm) : comm_(comm) {
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~MpiComm() override {
        // Freeing after MPI_Finalize is an error; a communicator that outlives the runtime is simply dropped.
        if (comm_ != MPI_COMM_NULL && dist_mpi_active()) MPI_Comm_free(&comm_);
    }
    int rank() const override {
        return rank_;
    }
    int size() const override {
        return size_;
    }
    std::string_view backend() const override {
        return "mpi";
    }

    CommWork all_reduce(void* data, int64_t count, CommType type, ReduceOp op) override {
        const CommTimer timed = record(CommOp::all_reduce, bytes(count, type));
        auto work = std::make_unique<MpiWork>();
        auto* p = static_cast<char*>(data);
        for (int64_t begin = 0; begin < count; begin += kMaxChunk) {
            const int n = static_cast<int>(std::min(kMaxChunk, count - begin));
            MPI_Request& req = work->requests.emplace_back();
            check(MPI_Iallreduce(MPI_IN_PLACE, p + begin * elem(type), n, mpi_type(type), mpi_op(op), comm_, &req),
                  "MPI_Iallreduce");
        }
        return handle(std::move(work));
    }

    CommWork reduce_scatter(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) override {
        const CommTimer timed = record(CommOp::reduce_scatter, bytes(count * size_, type));
        auto work = std::make_unique<MpiWork>();
        check(MPI_Ireduce_scatter_block(send,
                                        recv,
                                        to_int(count, "reduce_scatter"),
                                        mpi_type(type),
                                        mpi_op(op),
                                        comm_,
                                        &work->requests.emplace_back()),
              "MPI_Ireduce_scatter_block");
        return handle(std::move(work));
    }

    CommWork all_gather(const void* send, void* recv, int64_t count, CommType type) override {
        const CommTimer timed = record(CommOp::all_gather, bytes(count, type));
        const int n = to_int(count, "all_gather");
        to_int(count * size_, "all_gather");
        const bool in_place = send == static_cast<const char*>(recv) + count * rank_ * elem(type);
        auto work = std::make_unique<MpiWork>();
        check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send,
                             n,
                             mpi_type(type),
                             recv,
                             n,
                             mpi_type(type),
                             comm_,
                             &work->requests.emplace_back()),
              "MPI_Iallgather");
        return handle(std::move(work));
    }

    CommWork all_to_all_v(const void* send,
                          std::span<const int64_t> send_counts,
                          void* recv,
                          std::span<const int64_t> recv_counts,
                          CommType type) override {
        MT_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_,
                 "all_to_all_v: counts need one entry per rank ({} ranks)",
                 size_);
        auto work = std::make_unique<MpiWork>();
        // counts: send counts, send displacements, recv counts, recv displacements.
        work->counts.resize(static_cast<size_t>(4 * size_));
        int* sc = work->counts.data();
        int* sd = sc + size_;
        int* rc = sd + size_;
        int* rd = rc + size_;
        int64_t s_total = 0, r_total = 0;
        for (int r = 0; r < size_; ++r) {
            sc[r] = to_int(send_counts[static_cast<size_t>(r)], "all_to_all_v send count");
            rc[r] = to_int(recv_counts[static_cast<size_t>(r)], "all_to_all_v recv count");
            sd[r] = to_int(s_total, "all_to_all_v send displacement");
            rd[r] = to_int(r_total, "all_to_all_v recv displacement");
            s_total += sc[r];
            r_total += rc[r];
        }
        const CommTimer timed = record(CommOp::all_to_all_v, bytes(s_total, type));
        check(MPI_Ialltoallv(
                  send, sc, sd, mpi_type(type), recv, rc, rd, mpi_type(type), comm_, &work->requests.emplace_back()),
              "MPI_Ialltoallv");
        return handle(std::move(work));
    }

    CommWork broadcast(void* data, int64_t count, CommType type, int root) override {
        const CommTimer timed = record(CommOp::broadcast, bytes(count, type));
        auto work = std::make_unique<MpiWork>();
        auto* p = static_cast<char*>(data);
        for (int64_t begin = 0; begin < count; begin += kMaxChunk) {
            const int n = static_cast<int>(std::min(kMaxChunk, count - begin));
            check(MPI_Ibcast(p + begin * elem(type), n, mpi_type(type), root, comm_, &work->requests.emplace_back()),
                  "MPI_Ibcast");
        }
        return handle(std::move(work));
    }

    CommWork send(const void* data, int64_t count, CommType type, int peer, int tag) override {
        const CommTimer timed = record(CommOp::send, bytes(count, type));
        auto work = std::make_unique<MpiWork>();
        check(MPI_Isend(data, to_int(count, "send"), mpi_type(type), peer, tag, comm_, &work->requests.emplace_back()),
              "MPI_Isend");
        return handle(std::move(work));
    }

    CommWork recv(void* data, int64_t count, CommType type, int peer, int tag) override {
        const CommTimer timed = record(CommOp::recv, bytes(count, type));
        auto work = std::make_unique<MpiWork>();
        check(MPI_Irecv(data, to_int(count, "recv"), mpi_type(type), peer, tag, comm_, &work->requests.emplace_back()),
              "MPI_Irecv");
        return handle(std::move(work));
    }

    void barrier() override {
        const CommTimer timed = record(CommOp::barrier, 0);
        check(MPI_Barrier(comm_), "MPI_Barrier");
    }

    std::unique_ptr<Comm> split(int color, int key) override {
        MPI_Comm sub = MPI_COMM_NULL;
        check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
        return std::make_unique<MpiComm>(sub);
    }

   private:
    static int64_t elem(CommType type) {
        return static_cast<int64_t>(comm_type_size(type));
    }
    static int64_t bytes(int64_t count, CommType type) {
        return count * elem(type);
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> comm_make_mpi_world() {
    MPI_Comm dup = MPI_COMM_NULL;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
    return std::make_unique<MpiComm>(dup);
}

}  // namespace mt::parallel
