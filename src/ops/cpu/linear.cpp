// CPU reference of the linear layer: OpenBLAS GEMMs over fixed row chunks, run in parallel by OpenMP.
#include <algorithm>

#include "ops/cpu/blas.h"
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kRowChunk = 128;  // rows of x / y per GEMM call in the forward and in dx
constexpr int64_t kTile = 256;      // dw is computed in [kTile, kTile] tiles, one GEMM each
}  // namespace

// y[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]), one GEMM per chunk of kRowChunk rows.
template <typename T>
void linear_fwd(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t k, int64_t m) {
    blas_use_one_thread();
    const int64_t chunks = chunk_count(n, kRowChunk);
#pragma omp parallel for schedule(dynamic, 1) if (n * k * m >= kParallelMinWork)
    for (int64_t ch = 0; ch < chunks; ++ch) {
        const int64_t r0 = ch * kRowChunk, rows = std::min(n, r0 + kRowChunk) - r0;
        T* yc = y + r0 * m;  // [rows, m]
        if (bias)
            for (int64_t i = 0; i < rows; ++i) std::copy(bias, bias + m, yc + i * m);
        gemm(false, true, rows, m, k, T(1), x + r0 * k, k, w, k, bias ? T(1) : T(0), yc, m);
    }
}

// dw[m, k] += dy[n, m]^T @ x[n, k]        (one GEMM per [kTile, kTile] tile of dw, each summing over all n)
// dbias[m] += sum_n dy[n, m]              (with the tiles of the first column block, rows added in order)
// dx[n, k] = dy[n, m] @ w[m, k]           (written; one GEMM per chunk of kRowChunk rows of dx)
// One task list, the large dw tiles first so that the small dx chunks balance the threads at the end.
template <typename T>
void linear_bwd(
    const T* x, const T* w, const T* dy, T* dx, T* dw, T* dbias, int64_t n, int64_t k, int64_t m, bool accumulate_dx) {
    blas_use_one_thread();
    const int64_t tile_rows = chunk_count(m, kTile), tile_cols = std::max<int64_t>(chunk_count(k, kTile), 1);
    const int64_t dw_tasks = tile_rows * tile_cols, dx_tasks = dx ? chunk_count(n, kRowChunk) : 0;
#pragma omp parallel for schedule(dynamic, 1) if (n * k * m >= kParallelMinWork)
    for (int64_t task = 0; task < dw_tasks + dx_tasks; ++task) {
        if (task >= dw_tasks) {
            const int64_t r0 = (task - dw_tasks) * kRowChunk, rows = std::min(n, r0 + kRowChunk) - r0;
            gemm(false, false, rows, k, m, T(1), dy + r0 * m, m, w, k, T(accumulate_dx ? 1 : 0), dx + r0 * k, k);
            continue;
        }
        const int64_t tr = task / tile_cols, tc = task % tile_cols;
        const int64_t o0 = tr * kTile, outs = std::min(m, o0 + kTile) - o0;
        const int64_t c0 = tc * kTile, cols = std::min(k, c0 + kTile) - c0;
        gemm(true, false, outs, cols, n, T(1), dy + o0, m, x + c0, k, T(1), dw + o0 * k + c0, k);
        if (dbias && tc == 0) {
            for (int64_t i = 0; i < n; ++i) {
                const T* dyr = dy + i * m + o0;  // [outs]
                for (int64_t j = 0; j < outs; ++j) dbias[o0 + j] += dyr[j];
            }
        }
    }
}

template void linear_fwd<float>(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t);
template void linear_fwd<double>(const double*, const double*, const double*, double*, int64_t, int64_t, int64_t);
template void linear_bwd<float>(
    const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t, bool);
template void linear_bwd<double>(
    const double*, const double*, const double*, double*, double*, double*, int64_t, int64_t, int64_t, bool);

}  // namespace mt::ops::cpu
