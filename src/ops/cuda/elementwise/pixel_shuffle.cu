// CUDA 2x2 pixel shuffle over packed images (ops/pixel_shuffle.h), forward and inverse: a bitwise row-slice copy.
// Dtypes: x and y (dx and dy) bf16|f16|f32, the same dtype. The host turns the grids (a host tensor) into a table of
// n + 1 first output rows and n grid widths, copied to the device on the op's stream; each thread finds its output
// row's image by binary search in it and copies one word (16, 8, 4 or 2 bytes, the widest that divides a patch row
// and the pointers' alignment). Every element is written once, so the result is deterministic.
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/prim/row_words.cuh"
#include "ops/pixel_shuffle.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// table: [2n + 1] int64: start[0..n] (the first output row of each image, then P/4), width[n] (each image's grid w).
// Thread k: output row o, quarter q, word i of the patch row (row_words words). Image k_o holds o (start[k_o] <= o <
// start[k_o + 1]); its local cell l = o - start[k_o] is (r, c) = (l / (w/2), l % (w/2)), and quarter q is patch row
// 4 start[k_o] + (2r + q/2) w + 2c + q%2. inverse: cells -> patches (the backward).
template <typename W>
__global__ void pixel_shuffle_kernel(W* patches,
                                     W* cells,
                                     const int64_t* __restrict__ table,
                                     int64_t n,
                                     int64_t out_rows,
                                     int64_t row_words,
                                     bool inverse) {
    const int64_t* start = table;          // [n + 1]
    const int64_t* width = table + n + 1;  // [n]
    const int64_t total = out_rows * 4 * row_words;
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t slot = k / row_words, i = k % row_words, o = slot / 4, q = slot % 4;
        int64_t lo = 0, hi = n - 1;  // the last image whose start is <= o
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            if (start[mid] <= o)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int64_t w = width[lo], l = o - start[lo], r = l / (w / 2), c = l % (w / 2);
        const int64_t src = 4 * start[lo] + (2 * r + q / 2) * w + 2 * c + q % 2;
        W* patch = patches + src * row_words + i;
        W* cell = cells + slot * row_words + i;
        if (inverse)
            *patch = *cell;
        else
            *cell = *patch;
    }
}

void pixel_shuffle_run(const Tensor& patches,
                       const Tensor& grids,
                       const Tensor& cells,
                       bool inverse,
                       std::string_view op,
                       std::string_view patches_arg,
                       std::string_view cells_arg) {
    check_cuda_float(patches, op, patches_arg);
    check_dtype_as(cells, patches, op, cells_arg, patches_arg);
    const int64_t n = grids.size(0), out_rows = cells.size(0);
    const int64_t row_bytes = patches.size(1) * static_cast<int64_t>(core::dtype_size(patches.dtype()));
    if (patches.numel() == 0) return;
    core::NvtxRange range(inverse ? "pixel_shuffle_bwd" : "pixel_shuffle_fwd");
    std::vector<int64_t> table(static_cast<size_t>(2 * n + 1));  // start[0..n], width[0..n-1]
    const int32_t* g = grids.data<int32_t>();
    for (int64_t k = 0; k < n; ++k) {
        table[k + 1] = table[k] + int64_t{g[2 * k]} * g[2 * k + 1] / 4;
        table[n + 1 + k] = g[2 * k + 1];
    }
    // Written in full by the copy before the kernel reads it (a pageable source is staged before the call returns).
    const Tensor table_dev = Tensor::scratch({2 * n + 1}, DType::i64, core::Device::cuda);
    MT_CUDA_CHECK(cudaMemcpyAsync(
        table_dev.raw(), table.data(), table.size() * sizeof(int64_t), cudaMemcpyHostToDevice, core::exec_stream()));
    const int bytes = row_word_bytes(row_bytes, patches.raw(), cells.raw());
    const int64_t row_words = row_bytes / bytes, work = out_rows * 4 * row_words;
    const int64_t* tp = static_cast<const int64_t*>(table_dev.raw());
    const auto launch = [&](auto word) {
        using W = decltype(word);
        pixel_shuffle_kernel<W><<<grid_for(work, kThreads), kThreads, 0, core::exec_stream()>>>(
            static_cast<W*>(patches.raw()), static_cast<W*>(cells.raw()), tp, n, out_rows, row_words, inverse);
    };
    with_row_word(bytes, launch);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void pixel_shuffle_fwd(const Tensor& x, const Tensor& grids, const Tensor& y) {
    pixel_shuffle_run(x, grids, y, false, "pixel_shuffle_fwd", "x", "y");
}
MT_REGISTER_KERNEL(pixel_shuffle_fwd, cuda, pixel_shuffle_fwd, ::mt::ops::half_and_float_dtypes);

void pixel_shuffle_bwd(const Tensor& grids, const Tensor& dy, const Tensor& dx) {
    pixel_shuffle_run(dx, grids, dy, true, "pixel_shuffle_bwd", "dx", "dy");
}
MT_REGISTER_KERNEL(pixel_shuffle_bwd, cuda, pixel_shuffle_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
