// CUDA splice_rows (ops/splice_rows.h): a grid-stride, bitwise row copy from src into x at the index rows, and
// backward the gather of those rows of dx into dsrc, each then zeroed in dx. Dtypes: bf16|f16|f32, src (dsrc) the
// dtype of x (dx). Each thread moves one word (16, 8, 4 or 2 bytes, the widest that divides a row and both pointers'
// alignment). The index is not read back: an entry outside [0, N) is skipped, and distinct entries (the caller's
// guarantee) make every element written by one thread, so the result is deterministic.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/prim/row_words.cuh"
#include "ops/registry.h"
#include "ops/splice_rows.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Thread k: row i = k / row_words of rows ([m, row_words] words), word w = k % row_words; its slot is row index[i] of
// seq ([n, row_words] words). backward: rows <- seq, then the seq word zeroed (0 bits are 0 in every float dtype).
template <typename W>
__global__ void splice_rows_kernel(
    const int32_t* __restrict__ index, W* rows, W* seq, int64_t m, int64_t n, int64_t row_words, bool backward) {
    const int64_t total = m * row_words;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = k / row_words, w = k % row_words, r = index[i];
        if (r < 0 || r >= n) continue;
        W* slot = seq + r * row_words + w;
        W* row = rows + i * row_words + w;
        if (backward) {
            *row = *slot;
            *slot = W{};
        } else {
            *slot = *row;
        }
    }
}

void splice_rows_run(const Tensor& rows,
                     std::string_view rows_arg,
                     const Tensor& index,
                     const Tensor& seq,
                     std::string_view seq_arg,
                     bool backward,
                     std::string_view op) {
    check_cuda_float(seq, op, seq_arg);
    check_dtype_as(rows, seq, op, rows_arg, seq_arg);
    const int64_t m = rows.size(0), n = seq.size(0);
    const int64_t row_bytes = seq.size(1) * static_cast<int64_t>(core::dtype_size(seq.dtype()));
    if (rows.numel() == 0) return;
    core::NvtxRange range(backward ? "splice_rows_bwd" : "splice_rows_fwd");
    const int bytes = row_word_bytes(row_bytes, rows.raw(), seq.raw());
    const int64_t row_words = row_bytes / bytes, work = m * row_words;
    const int32_t* ip = index.data<int32_t>();
    const auto launch = [&](auto word) {
        using W = decltype(word);
        splice_rows_kernel<W><<<grid_for(work, kThreads), kThreads, 0, core::exec_stream()>>>(
            ip, static_cast<W*>(rows.raw()), static_cast<W*>(seq.raw()), m, n, row_words, backward);
    };
    with_row_word(bytes, launch);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void splice_rows_fwd(const Tensor& src, const Tensor& index, const Tensor& x) {
    splice_rows_run(src, "src", index, x, "x", false, "splice_rows_fwd");
}
MT_REGISTER_KERNEL(splice_rows_fwd, cuda, splice_rows_fwd, ::mt::ops::half_and_float_dtypes);

void splice_rows_bwd(const Tensor& index, const Tensor& dx, const Tensor& dsrc) {
    splice_rows_run(dsrc, "dsrc", index, dx, "dx", true, "splice_rows_bwd");
}
MT_REGISTER_KERNEL(splice_rows_bwd, cuda, splice_rows_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
