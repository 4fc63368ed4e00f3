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

core::Tensor cp_local(const ContextParallel& cp, const core::Tensor& whole) {
    core::Shape shape = whole.shape();
    shape.at(1) /= cp.size;
    const core::Tensor local = core::Tensor::scratch(shape, whole.dtype(), core::Device::cpu);
    cp_local_rows(cp, whole, local);
    return local;
}

core::Tensor cp_local_positions(const ContextParallel& cp,
                                const core::Tensor& positions,
                                int64_t batch,
                                int64_t total) {
    if (positions.defined()) return cp_local(cp, positions);
    const parallel::Zigzag z = cp.layout(total);
    const core::Tensor local = core::Tensor::zeros({batch, z.local()}, core::DType::i32);
    int32_t* p = local.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < z.local(); ++i) p[b * z.local() + i] = static_cast<int32_t>(z.position(i));
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

void cp_reduce_scatter_rows(const ContextParallel& cp, const core::Tensor& whole, const core::Tensor& local) {
    const parallel::Zigzag z = checked_layout(cp, whole, local);
    const core::Tensor blocks = rank_blocks(cp, local);
    for (int64_t r = 0; r < cp.size; ++r) whole_to_block(z, r, whole, blocks.select(0, r));
    cp.group().reduce_scatter(blocks, local, parallel::ReduceOp::sum).wait();
}

}  // namespace mt::nn
