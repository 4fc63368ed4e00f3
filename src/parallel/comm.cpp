// The parts of Comm every backend shares (handles, tensor forms, statistics) and the one-process backend.
#include "parallel/comm.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>

namespace mt::parallel {

size_t comm_type_size(CommType type) {
    switch (type) {
        case CommType::f32:
        case CommType::i32:
            return 4;
        case CommType::f64:
        case CommType::i64:
        case CommType::u64:
            return 8;
        case CommType::u8:
            return 1;
        case CommType::bf16:
        case CommType::f16:
            return 2;
    }
    return 0;
}

CommType comm_type_of(core::DType dtype) {
    switch (dtype) {
        case core::DType::f32:
            return CommType::f32;
        case core::DType::f64:
            return CommType::f64;
        case core::DType::i32:
            return CommType::i32;
        case core::DType::i64:
            return CommType::i64;
        case core::DType::u8:
            return CommType::u8;
        case core::DType::bf16:
            return CommType::bf16;
        case core::DType::f16:
            return CommType::f16;
        default:
            MT_CHECK(false, "Comm has no element type for {}", core::dtype_name(dtype));
    }
    return CommType::u8;
}

std::string_view comm_op_name(CommOp op) {
    static constexpr std::array<std::string_view, kCommOpCount> names = {
        "all_reduce", "reduce_scatter", "all_gather", "all_to_all_v", "broadcast", "send", "recv", "barrier"};
    return names[static_cast<size_t>(op)];
}

namespace {

// Waits for a handle that is being dropped. Its callers are noexcept (a destructor, a move assignment), so a failed
// operation is reported here and ends the process with the communication exit code, instead of std::terminate
// without a message.
void wait_dropped(CommWork::Impl& impl) noexcept {
    try {
        impl.wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moetrain: error: %s\n", e.what());
        std::fflush(stderr);
        std::_Exit(static_cast<int>(core::ExitCode::distributed));
    }
}

}  // namespace

// The clock stays with a completed handle: a timer must not outlive the clock it adds to.
CommWork& CommWork::operator=(CommWork&& other) noexcept {
    if (this != &other) {
        if (impl_) {
            const CommTimer timed(clock_.get());
            wait_dropped(*impl_);
        }
        impl_ = std::move(other.impl_);
        clock_ = std::move(other.clock_);
    }
    return *this;
}

CommWork::~CommWork() {
    if (!impl_) return;
    const CommTimer timed(clock_.get());
    wait_dropped(*impl_);
}

void CommWork::wait() {
    if (!impl_) return;
    const CommTimer timed(clock_.get());
    impl_->wait();
    impl_.reset();
}

void CommWork::wait_on_device() {
    if (!impl_) return;
    const CommTimer timed(clock_.get());
    impl_->wait_on_device();
    impl_.reset();
}

bool CommWork::done() {
    if (!impl_) return true;
    const CommTimer timed(clock_.get());
    if (!impl_->test()) return false;
    impl_.reset();
    return true;
}

namespace {

void check_host_tensor(const core::Tensor& t, const char* what) {
    MT_CHECK(t.defined() && t.is_contiguous(), "{}: Comm needs a contiguous tensor", what);
    MT_CHECK(t.device() == core::Device::cpu, "{}: this Comm moves host memory; the tensor is on the GPU", what);
}

}  // namespace

CommWork Comm::all_reduce(const core::Tensor& t, ReduceOp op) {
    check_host_tensor(t, "all_reduce");
    return all_reduce(t.raw(), t.numel(), comm_type_of(t.dtype()), op);
}

CommWork Comm::reduce_scatter(const core::Tensor& send, const core::Tensor& recv, ReduceOp op) {
    check_host_tensor(send, "reduce_scatter");
    check_host_tensor(recv, "reduce_scatter");
    MT_CHECK(send.dtype() == recv.dtype(), "reduce_scatter: dtypes differ");
    MT_CHECK_SHAPE(send.numel(), recv.numel() * size(), "reduce_scatter: send elements vs recv elements x ranks");
    return reduce_scatter(send.raw(), recv.raw(), recv.numel(), comm_type_of(recv.dtype()), op);
}

CommWork Comm::all_gather(const core::Tensor& send, const core::Tensor& recv) {
    check_host_tensor(send, "all_gather");
    check_host_tensor(recv, "all_gather");
    MT_CHECK(send.dtype() == recv.dtype(), "all_gather: dtypes differ");
    MT_CHECK_SHAPE(send.numel() * size(), recv.numel(), "all_gather: send elements x ranks vs recv elements");
    return all_gather(send.raw(), recv.raw(), send.numel(), comm_type_of(send.dtype()));
}

CommWork Comm::broadcast(const core::Tensor& t, int root) {
    check_host_tensor(t, "broadcast");
    return broadcast(t.raw(), t.numel(), comm_type_of(t.dtype()), root);
}

void comm_all_reduce_through_host(Comm& comm, const core::Tensor& t) {
    const core::Tensor host = t.device() == core::Device::cpu ? t : t.to_device(core::Device::cpu);
    comm.all_reduce(host).wait();
    if (host.raw() != t.raw()) t.copy_from(host);
}

double comm_all_reduce_sum(Comm& comm, double value) {
    comm.all_reduce(&value, 1, CommType::f64, ReduceOp::sum).wait();
    return value;
}

int64_t comm_all_reduce_max(Comm& comm, int64_t value) {
    comm.all_reduce(&value, 1, CommType::i64, ReduceOp::max).wait();
    return value;
}

std::vector<std::string> comm_gather_strings(Comm& comm, const std::string& mine, int root) {
    const auto p = static_cast<size_t>(comm.size());
    std::vector<int64_t> lengths(p);
    const auto len = static_cast<int64_t>(mine.size());
    comm.all_gather(&len, lengths.data(), 1, CommType::i64).wait();
    // An all-to-all in which only the root receives: every rank sends its bytes to the root and nothing elsewhere.
    std::vector<int64_t> send_counts(p, 0), recv_counts(p, 0);
    send_counts[static_cast<size_t>(root)] = len;
    if (comm.rank() == root) recv_counts = lengths;
    int64_t total = 0;
    for (int64_t l : recv_counts) total += l;
    std::string all(static_cast<size_t>(total), '\0');
    comm.all_to_all_v(mine.data(), send_counts, all.data(), recv_counts, CommType::u8).wait();
    std::vector<std::string> out;
    if (comm.rank() != root) return out;
    size_t at = 0;
    for (int64_t l : lengths) {
        out.push_back(all.substr(at, static_cast<size_t>(l)));
        at += static_cast<size_t>(l);
    }
    return out;
}

namespace {

// World size 1: reductions are the identity and gathers and all-to-alls are copies.
class SelfComm final : public Comm {
   public:
    int rank() const override {
        return 0;
    }
    int size() const override {
        return 1;
    }
    std::string_view backend() const override {
        return "self";
    }
    CommWork all_reduce(void* data, int64_t count, CommType type, ReduceOp op) override {
        const CommTimer timed = record(CommOp::all_reduce, count * static_cast<int64_t>(comm_type_size(type)));
        return {};
    }
    CommWork reduce_scatter(const void* send, void* recv, int64_t count, CommType type, ReduceOp op) override {
        copy(CommOp::reduce_scatter, send, recv, count, type);
        return {};
    }
    CommWork all_gather(const void* send, void* recv, int64_t count, CommType type) override {
        copy(CommOp::all_gather, send, recv, count, type);
        return {};
    }
    CommWork all_to_all_v(const void* send,
                          std::span<const int64_t> send_counts,
                          void* recv,
                          std::span<const int64_t> recv_counts,
                          CommType type) override {
        MT_CHECK(send_counts.size() == 1 && recv_counts.size() == 1, "all_to_all_v: counts need one entry per rank");
        MT_CHECK_SHAPE(send_counts[0], recv_counts[0], "all_to_all_v: elements sent to self vs received");
        copy(CommOp::all_to_all_v, send, recv, send_counts[0], type);
        return {};
    }
    CommWork broadcast(void* data, int64_t count, CommType type, int root) override {
        MT_CHECK(root == 0, "broadcast root {} outside a world of one", root);
        const CommTimer timed = record(CommOp::broadcast, count * static_cast<int64_t>(comm_type_size(type)));
        return {};
    }
    CommWork send(const void* data, int64_t count, CommType type, int peer, int tag) override {
        MT_CHECK(false, "send to rank {} in a world of one process", peer);
        return {};
    }
    CommWork recv(void* data, int64_t count, CommType type, int peer, int tag) override {
        MT_CHECK(false, "recv from rank {} in a world of one process", peer);
        return {};
    }
    void barrier() override {
        const CommTimer timed = record(CommOp::barrier, 0);
    }
    std::unique_ptr<Comm> split(int color, int key) override {
        return comm_make_self();
    }

   private:
    void copy(CommOp op, const void* send, void* recv, int64_t n, CommType type) {
        const size_t bytes = static_cast<size_t>(n) * comm_type_size(type);
        const CommTimer timed = record(op, static_cast<int64_t>(bytes));
        if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    }
};

}  // namespace

std::unique_ptr<Comm> comm_make_self() {
    return std::make_unique<SelfComm>();
}

}  // namespace mt::parallel
