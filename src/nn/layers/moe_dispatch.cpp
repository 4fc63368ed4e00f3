// Expert-parallel dispatch and combine by all-to-all with per-rank counts.
#include "nn/layers/moe_dispatch.h"

#include <algorithm>

#include "ops/moe_permute.h"
#include "parallel/comm.h"

namespace mt::nn {

void MoeDispatch::plan(const core::Tensor& offsets, parallel::Comm& counts, parallel::Comm& rows, core::Device device) {
    MT_CHECK(offsets.device() == core::Device::cpu && offsets.dtype() == core::DType::i32 && offsets.ndim() == 1,
             "moe dispatch: offsets must be [E + 1] i32 on the host");
    MT_CHECK(counts.size() == rows.size(), "moe dispatch: count and row communicators differ in size");
    MT_CHECK(device == core::Device::cpu || rows.size() == 1 || rows.backend() == "nccl",
             "moe dispatch: GPU rows over the {} backend (expert parallelism on the GPU needs an NCCL communicator)",
             rows.backend());
    rows_comm_ = &rows;
    const int64_t p = counts.size(), e = offsets.numel() - 1;
    MT_CHECK(e % p == 0, "moe dispatch: {} experts over {} ranks", e, p);
    const int64_t el = e / p;
    const int32_t* off = offsets.data<int32_t>();
    source_rows_ = off[e];
    // Per-expert row counts for each destination rank's experts, exchanged so every rank knows what arrives.
    std::vector<int64_t> send_counts(static_cast<size_t>(e)), recv_counts(static_cast<size_t>(e));
    for (int64_t j = 0; j < e; ++j) send_counts[static_cast<size_t>(j)] = off[j + 1] - off[j];
    const std::vector<int64_t> per_rank(static_cast<size_t>(p), el);
    counts.all_to_all_v(send_counts.data(), per_rank, recv_counts.data(), per_rank, parallel::CommType::i64).wait();
    // recv_counts[s El + j]: rows rank s sends to local expert j.
    send_rows_.assign(static_cast<size_t>(p), 0);
    recv_rows_.assign(static_cast<size_t>(p), 0);
    local_offsets_ = core::Tensor::zeros({el + 1}, core::DType::i32);
    int32_t* loc = local_offsets_.data<int32_t>();
    for (int64_t s = 0; s < p; ++s)
        for (int64_t j = 0; j < el; ++j) {
            send_rows_[static_cast<size_t>(s)] += send_counts[static_cast<size_t>(s * el + j)];
            recv_rows_[static_cast<size_t>(s)] += recv_counts[static_cast<size_t>(s * el + j)];
            loc[j + 1] += static_cast<int32_t>(recv_counts[static_cast<size_t>(s * el + j)]);
        }
    for (int64_t j = 0; j < el; ++j) loc[j + 1] += loc[j];
    expert_rows_ = loc[el];
    // Received rows arrive as [s][j][row]; expert j's block holds its sources in rank order.
    const int64_t n = std::max<int64_t>(expert_rows_, 1);
    core::Tensor by_expert = core::Tensor::zeros({n}, core::DType::i32),
                 by_source = core::Tensor::zeros({n}, core::DType::i32);
    std::vector<int32_t> next(loc, loc + el);
    int32_t i = 0;
    for (int64_t s = 0; s < p; ++s)
        for (int64_t j = 0; j < el; ++j)
            for (int64_t r = 0; r < recv_counts[static_cast<size_t>(s * el + j)]; ++r, ++i) {
                const int32_t to = next[static_cast<size_t>(j)]++;
                by_expert.data<int32_t>()[i] = to;
                by_source.data<int32_t>()[to] = i;
            }
    by_expert_ = device == core::Device::cpu ? by_expert : by_expert.to_device(device);
    by_source_ = device == core::Device::cpu ? by_source : by_source.to_device(device);
}

namespace {

std::vector<int64_t> scaled(const std::vector<int64_t>& rows, int64_t width) {
    std::vector<int64_t> out(rows);
    for (auto& v : out) v *= width;
    return out;
}

void check_rows(const core::Tensor& t, int64_t rows, int64_t width, const char* what) {
    MT_CHECK(t.ndim() == 2 && t.size(0) == rows && t.size(1) == width && t.is_contiguous(),
             "moe dispatch: {} has shape {}, expected [{}, {}] contiguous",
             what,
             core::shape_str(t.shape()),
             rows,
             width);
}

// One all-to-all of [rows, C] row blocks: `from` holds send[p] rows for each peer p in peer order, `to` receives
// recv[p] from each. Rows are moved as bytes: all-to-all does no arithmetic, so any dtype (bf16 too) travels.
[[nodiscard]] parallel::CommWork exchange_rows(parallel::Comm& comm,
                                               const core::Tensor& from,
                                               const std::vector<int64_t>& send,
                                               const core::Tensor& to,
                                               const std::vector<int64_t>& recv) {
    const int64_t row_bytes = from.size(1) * static_cast<int64_t>(core::dtype_size(from.dtype()));
    return comm.all_to_all_v(
        from.raw(), scaled(send, row_bytes), to.raw(), scaled(recv, row_bytes), parallel::CommType::u8);
}

}  // namespace

core::Tensor MoeDispatch::staging(const core::Tensor& like, int64_t rows) {
    const int64_t need = std::max<int64_t>(rows * like.size(1), 1);
    if (!staging_.defined() || staging_.numel() < need || staging_.dtype() != like.dtype() ||
        staging_.device() != like.device())
        staging_ = core::Tensor::zeros({need}, like.dtype(), like.device());
    return staging_.slice(0, 0, rows * like.size(1)).reshape({rows, like.size(1)});
}

void MoeDispatch::start_to_experts(const core::Tensor& src, const core::Tensor& dst) {
    MT_CHECK(rows_comm_ != nullptr, "moe dispatch: to_experts before plan");
    MT_CHECK(!in_flight_, "moe dispatch: an exchange is already in flight");
    const int64_t c = src.ndim() == 2 ? src.size(1) : 0;
    check_rows(src, source_rows_, c, "source rows");
    check_rows(dst, expert_rows_, c, "expert rows");
    received_ = staging(src, expert_rows_);
    pending_dst_ = dst;
    pending_ = exchange_rows(*rows_comm_, src, send_rows_, received_, recv_rows_);
    in_flight_ = true;
}

void MoeDispatch::start_to_sources(const core::Tensor& src, const core::Tensor& dst) {
    MT_CHECK(rows_comm_ != nullptr, "moe dispatch: to_sources before plan");
    MT_CHECK(!in_flight_, "moe dispatch: an exchange is already in flight");
    const int64_t c = src.ndim() == 2 ? src.size(1) : 0;
    check_rows(src, expert_rows_, c, "expert rows");
    check_rows(dst, source_rows_, c, "source rows");
    const core::Tensor outgoing = staging(src, expert_rows_);
    if (expert_rows_ > 0) ops::moe_permute_fwd(src, by_expert_.slice(0, 0, expert_rows_), outgoing);
    received_ = core::Tensor();
    pending_dst_ = core::Tensor();
    pending_ = exchange_rows(*rows_comm_, outgoing, recv_rows_, dst, send_rows_);
    in_flight_ = true;
}

void MoeDispatch::finish(bool block_host) {
    MT_CHECK(in_flight_, "moe dispatch: finish with no exchange in flight");
    if (block_host)
        pending_.wait();
    else
        pending_.wait_on_device();
    in_flight_ = false;
    if (pending_dst_.defined() && expert_rows_ > 0)
        ops::moe_permute_fwd(received_, by_source_.slice(0, 0, expert_rows_), pending_dst_);
    received_ = core::Tensor();
    pending_dst_ = core::Tensor();
}

}  // namespace mt::nn
