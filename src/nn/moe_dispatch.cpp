// Expert-parallel dispatch and combine by all-to-all with per-rank counts.
#include "nn/moe_dispatch.h"

#include <algorithm>
#include <cstring>

#include "dist/comm.h"

namespace mt::nn {

void MoeDispatch::plan(const core::Tensor& offsets, dist::Comm& comm) {
    MT_CHECK(offsets.device() == core::Device::cpu && offsets.dtype() == core::DType::i32 && offsets.ndim() == 1,
             "moe dispatch: offsets must be [E + 1] i32 on the host");
    comm_ = &comm;
    const int64_t p = comm.size(), e = offsets.numel() - 1;
    MT_CHECK(e % p == 0, "moe dispatch: {} experts over {} ranks", e, p);
    const int64_t el = e / p;
    const int32_t* off = offsets.data<int32_t>();
    source_rows_ = off[e];
    // Per-expert row counts for each destination rank's experts, exchanged so every rank knows what arrives.
    std::vector<int64_t> send_counts(static_cast<size_t>(e)), recv_counts(static_cast<size_t>(e));
    for (int64_t j = 0; j < e; ++j) send_counts[static_cast<size_t>(j)] = off[j + 1] - off[j];
    const std::vector<int64_t> per_rank(static_cast<size_t>(p), el);
    comm.all_to_all_v(send_counts.data(), per_rank, recv_counts.data(), per_rank, dist::CommType::i64).wait();
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
    order_.assign(static_cast<size_t>(expert_rows_), 0);
    std::vector<int64_t> next(loc, loc + el);
    int64_t i = 0;
    for (int64_t s = 0; s < p; ++s)
        for (int64_t j = 0; j < el; ++j)
            for (int64_t r = 0; r < recv_counts[static_cast<size_t>(s * el + j)]; ++r)
                order_[static_cast<size_t>(i++)] = next[static_cast<size_t>(j)]++;
}

namespace {

std::vector<int64_t> scaled(const std::vector<int64_t>& rows, int64_t width) {
    std::vector<int64_t> out(rows);
    for (auto& v : out) v *= width;
    return out;
}

void check_rows(const core::Tensor& t, int64_t rows, int64_t width, const char* what) {
    MT_CHECK(t.device() == core::Device::cpu && t.ndim() == 2 && t.size(0) == rows && t.size(1) == width &&
                 t.is_contiguous(),
             "moe dispatch: {} has shape {} on {}, expected [{}, {}] contiguous on the CPU (expert parallelism on the "
             "GPU needs the NCCL backend)",
             what,
             core::shape_str(t.shape()),
             core::device_name(t.device()),
             rows,
             width);
}

}  // namespace

void MoeDispatch::to_experts(const core::Tensor& src, const core::Tensor& dst) {
    MT_CHECK(comm_ != nullptr, "moe dispatch: to_experts before plan");
    const int64_t c = src.ndim() == 2 ? src.size(1) : 0;
    check_rows(src, source_rows_, c, "source rows");
    check_rows(dst, expert_rows_, c, "expert rows");
    if (!staging_.defined() || staging_.numel() < expert_rows_ * c || staging_.dtype() != src.dtype())
        staging_ = core::Tensor::zeros({std::max<int64_t>(expert_rows_ * c, 1)}, src.dtype());
    const dist::CommType type = dist::comm_type_of(src.dtype());
    comm_->all_to_all_v(src.raw(), scaled(send_rows_, c), staging_.raw(), scaled(recv_rows_, c), type).wait();
    const size_t row_bytes = static_cast<size_t>(c) * core::dtype_size(src.dtype());
    const auto* in = static_cast<const char*>(staging_.raw());
    auto* out = static_cast<char*>(dst.raw());
    for (size_t i = 0; i < order_.size(); ++i)
        std::memcpy(out + static_cast<size_t>(order_[i]) * row_bytes, in + i * row_bytes, row_bytes);
}

void MoeDispatch::to_sources(const core::Tensor& src, const core::Tensor& dst) {
    MT_CHECK(comm_ != nullptr, "moe dispatch: to_sources before plan");
    const int64_t c = src.ndim() == 2 ? src.size(1) : 0;
    check_rows(src, expert_rows_, c, "expert rows");
    check_rows(dst, source_rows_, c, "source rows");
    if (!staging_.defined() || staging_.numel() < expert_rows_ * c || staging_.dtype() != src.dtype())
        staging_ = core::Tensor::zeros({std::max<int64_t>(expert_rows_ * c, 1)}, src.dtype());
    const size_t row_bytes = static_cast<size_t>(c) * core::dtype_size(src.dtype());
    const auto* in = static_cast<const char*>(src.raw());
    auto* out = static_cast<char*>(staging_.raw());
    for (size_t i = 0; i < order_.size(); ++i)
        std::memcpy(out + i * row_bytes, in + static_cast<size_t>(order_[i]) * row_bytes, row_bytes);
    const dist::CommType type = dist::comm_type_of(src.dtype());
    comm_->all_to_all_v(staging_.raw(), scaled(recv_rows_, c), dst.raw(), scaled(send_rows_, c), type).wait();
}

}  // namespace mt::nn
