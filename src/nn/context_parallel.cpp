// The zigzag row moves of context parallelism: local rows out of a whole sequence, and the all-gather and
// reduce-scatter between a rank's rows and the whole sequence.
#include "nn/context_parallel.h"

#include "nn/segments.h"
#include "parallel/comm.h"

namespace mt::nn {

namespace {

// [B, T, ...] checks shared by the moves: contiguous host tensors of one dtype, local holding T / size rows.
parallel::Zigzag checked_layout(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local) {
    MT_CHECK(whole.ndim() >= 2 && whole.ndim() == local.ndim() && whole.size(0) == local.size(0),
             "context-parallel rows: whole {} and local {} must be [B, T, ...] and [B, T / cp, ...]",
             core::shape_str(whole.shape()),
             core::shape_str(local.shape()));
    const parallel::Zigzag z = cp.layout(whole.size(1));
    MT_CHECK(local.size(1) == z.local(), "context-parallel rows: {} local rows of {}", local.size(1), whole.size(1));
    MT_CHECK(whole.is_contiguous() && local.is_contiguous() && whole.dtype() == local.dtype() &&
                 whole.device() == core::Device::cpu && local.device() == core::Device::cpu,
             "context-parallel rows: contiguous host tensors of one dtype");
    return z;
}

// A [size, B, T / size, ...] buffer: every rank's local rows, in rank order.
core::Tensor rank_blocks(const ContextParallel& cp, const core::Tensor& local) {
    core::Shape shape = local.shape();
    shape.insert(shape.begin(), cp.size);
    return core::Tensor::scratch(shape, local.dtype(), core::Device::cpu);
}

// Between rank r's block [B, T / size, ...] of a rank_blocks buffer and its two chunks of whole [B, T, ...].
void block_to_whole(const parallel::Zigzag& z, int64_t r, const core::Tensor& block, const core::Tensor& whole) {
    const parallel::Zigzag of_r = parallel::zigzag(z.cp, r, z.seq);
    for (int s = 0; s < 2; ++s) copy_time_rows(whole, of_r.span_first(s), block, s * z.chunk(), z.chunk());
}

void whole_to_block(const parallel::Zigzag& z, int64_t r, const core::Tensor& whole, const core::Tensor& block) {
    const parallel::Zigzag of_r = parallel::zigzag(z.cp, r, z.seq);
    for (int s = 0; s < 2; ++s) copy_time_rows(block, s * z.chunk(), whole, of_r.span_first(s), z.chunk());
}

}  // namespace

parallel::Comm& ContextParallel::group() const {
    MT_CHECK(comm != nullptr, "context parallelism of size {} without a communicator", size);
    return *comm;
}

void cp_local_rows(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local) {
    whole_to_block(checked_layout(cp, whole, local), cp.rank, whole, local);
}

core::Tensor CpBatch::doc_map(int64_t lo, int64_t hi, core::Device device) const {
    if (!host_doc_start.defined()) return {};
    return doc_map_from(host_doc_start, first + lo, first + hi, device);
}

bool CpBatch::starts_document(int64_t b, int64_t pos) const {
    const int64_t at = first + pos;
    return host_doc_start.data<int32_t>()[b * host_doc_start.size(1) + at] == at;
}

core::Tensor cp_local(const ContextParallel& cp, const core::Tensor& whole) {
    core::Shape shape = whole.shape();
    shape.at(1) /= cp.size;
    const core::Tensor local = core::Tensor::scratch(shape, whole.dtype(), core::Device::cpu);
    cp_local_rows(cp, whole, local);
    return local;
}

core::Tensor cp_local_positions(
    const ContextParallel& cp, const core::Tensor& positions, int64_t batch, int64_t total, int64_t first) {
    if (positions.defined()) return cp_local(cp, positions);
    const parallel::Zigzag z = cp.layout(total);
    const core::Tensor local = core::Tensor::zeros({batch, z.local()}, core::DType::i32);
    int32_t* p = local.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < z.local(); ++i) p[b * z.local() + i] = static_cast<int32_t>(first + z.position(i));
    return local;
}

void cp_gather_rows(const ContextParallel& cp, const core::Tensor& local, const core::Tensor& whole) {
    const parallel::Zigzag z = checked_layout(cp, whole, local);
    const core::Tensor blocks = rank_blocks(cp, local);
    // A gather only moves data: bytes, any dtype.
    const int64_t bytes = local.numel() * static_cast<int64_t>(core::dtype_size(local.dtype()));
    cp.group().all_gather(local.raw(), blocks.raw(), bytes, parallel::CommType::u8).wait();
    for (int64_t r = 0; r < cp.size; ++r) block_to_whole(z, r, blocks.select(0, r), whole);
}

namespace {

// One piece of a halo: global rows [first, first + count) that span `span` of rank `to` needs, held by rank `from` at
// its local row `from_row`, landing at row `to_row` of the halo. All ranks list the same pieces in the same order.
struct HaloPiece {
    int64_t to = 0, from = 0;
    int span = 0;
    int64_t first = 0, count = 0, from_row = 0, to_row = 0;
};

std::vector<HaloPiece> halo_pieces(const ContextParallel& cp, int64_t total, int64_t before) {
    std::vector<HaloPiece> pieces;
    for (int64_t to = 0; to < cp.size; ++to) {
        const parallel::Zigzag z = parallel::zigzag(cp.size, to, total);
        const int64_t c = z.chunk();
        for (int s = 0; s < 2; ++s) {
            const int64_t hi = z.span_first(s), lo = std::max<int64_t>(0, hi - before);
            for (int64_t g = lo / c; g * c < hi; ++g) {  // the chunks the rows [lo, hi) touch
                const int64_t first = std::max(lo, g * c), last = std::min(hi, (g + 1) * c);
                const parallel::ZigzagOwner o = z.owner(g);
                pieces.push_back({.to = to,
                                  .from = o.rank,
                                  .span = s,
                                  .first = first,
                                  .count = last - first,
                                  .from_row = o.span * c + first - g * c,
                                  .to_row = first - lo});
            }
        }
    }
    return pieces;
}

// A contiguous [B, count, ...] buffer shaped like `like`'s rows.
core::Tensor rows_buffer(const core::Tensor& like, int64_t count) {
    core::Shape shape = like.shape();
    shape[1] = count;
    return core::Tensor::scratch(shape, like.dtype(), core::Device::cpu);
}

// Each piece's message tag: unique per (span, first chunk row) among the pieces one pair of ranks exchanges.
int halo_tag(const HaloPiece& p, int64_t total) {
    return static_cast<int>(p.span * total + p.first);
}

}  // namespace

std::array<core::Tensor, 2> cp_rows_before(const ContextParallel& cp,
                                           int64_t total,
                                           const core::Tensor& local,
                                           int64_t before) {
    const parallel::Zigzag z = cp.layout(total);
    MT_CHECK(
        local.ndim() >= 2 && local.size(1) == z.local() && local.is_contiguous() && local.device() == core::Device::cpu,
        "cp_rows_before: local {} is not this rank's contiguous host rows of {}",
        core::shape_str(local.shape()),
        total);
    std::array<core::Tensor, 2> halo;
    for (int s = 0; s < 2; ++s) {
        const int64_t h = std::min(before, z.span_first(s));
        if (h > 0) halo[static_cast<size_t>(s)] = rows_buffer(local, h);
    }
    const auto type = parallel::CommType::u8;  // rows only move: bytes
    const auto row_bytes = [&](int64_t rows) {
        return rows * (local.numel() / local.size(1)) * static_cast<int64_t>(core::dtype_size(local.dtype()));
    };
    std::vector<parallel::CommWork> pending;
    std::vector<std::pair<core::Tensor, HaloPiece>> received;
    std::vector<core::Tensor> sent;  // alive until the sends complete
    for (const HaloPiece& p : halo_pieces(cp, total, before)) {
        if (p.to == cp.rank && p.from == cp.rank) {
            copy_time_rows(halo[static_cast<size_t>(p.span)], p.to_row, local, p.from_row, p.count);
        } else if (p.from == cp.rank) {
            sent.push_back(rows_buffer(local, p.count));
            copy_time_rows(sent.back(), 0, local, p.from_row, p.count);
            pending.push_back(cp.group().send(
                sent.back().raw(), row_bytes(p.count), type, static_cast<int>(p.to), halo_tag(p, total)));
        } else if (p.to == cp.rank) {
            received.emplace_back(rows_buffer(local, p.count), p);
            pending.push_back(cp.group().recv(
                received.back().first.raw(), row_bytes(p.count), type, static_cast<int>(p.from), halo_tag(p, total)));
        }
    }
    for (parallel::CommWork& w : pending) w.wait();
    for (const auto& [rows, p] : received)
        copy_time_rows(halo[static_cast<size_t>(p.span)], p.to_row, rows, 0, p.count);
    return halo;
}

void cp_add_rows_before(const ContextParallel& cp,
                        int64_t total,
                        const std::array<core::Tensor, 2>& dhalo,
                        const core::Tensor& dlocal,
                        int64_t before) {
    const parallel::Zigzag z = cp.layout(total);
    MT_CHECK(dlocal.ndim() >= 2 && dlocal.size(1) == z.local() && dlocal.is_contiguous() &&
                 dlocal.device() == core::Device::cpu,
             "cp_add_rows_before: dlocal {} is not this rank's contiguous host rows of {}",
             core::shape_str(dlocal.shape()),
             total);
    const auto type = parallel::CommType::u8;
    const auto row_bytes = [&](int64_t rows) {
        return rows * (dlocal.numel() / dlocal.size(1)) * static_cast<int64_t>(core::dtype_size(dlocal.dtype()));
    };
    std::vector<parallel::CommWork> pending;
    std::vector<std::pair<core::Tensor, HaloPiece>> received;
    std::vector<core::Tensor> sent;
    for (const HaloPiece& p : halo_pieces(cp, total, before)) {
        if (p.to == cp.rank && p.from == cp.rank) {
            add_time_rows(dlocal, p.from_row, dhalo[static_cast<size_t>(p.span)], p.to_row, p.count);
        } else if (p.to == cp.rank) {  // the reverse direction: the halo's holder sends the gradient home
            sent.push_back(rows_buffer(dlocal, p.count));
            copy_time_rows(sent.back(), 0, dhalo[static_cast<size_t>(p.span)], p.to_row, p.count);
            pending.push_back(cp.group().send(
                sent.back().raw(), row_bytes(p.count), type, static_cast<int>(p.from), halo_tag(p, total)));
        } else if (p.from == cp.rank) {
            received.emplace_back(rows_buffer(dlocal, p.count), p);
            pending.push_back(cp.group().recv(
                received.back().first.raw(), row_bytes(p.count), type, static_cast<int>(p.to), halo_tag(p, total)));
        }
    }
    for (parallel::CommWork& w : pending) w.wait();
    for (const auto& [rows, p] : received) add_time_rows(dlocal, p.from_row, rows, 0, p.count);
}

void cp_reduce_scatter_rows(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local) {
    const parallel::Zigzag z = checked_layout(cp, whole, local);
    const core::Tensor blocks = rank_blocks(cp, local);
    for (int64_t r = 0; r < cp.size; ++r) whole_to_block(z, r, whole, blocks.select(0, r));
    cp.group().reduce_scatter(blocks, local, parallel::ReduceOp::sum).wait();
}

}  // namespace mt::nn
