// CPU reference of the linear layer: OpenBLAS GEMMs over fixed row chunks, run in parallel by OpenMP.
#include "ops/linear.h"

#include <algorithm>

#include "ops/cpu/blas.h"
#include "ops/cpu/checks.h"
#include "ops/cpu/linear.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

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
void linear_bwd(const T* x,
                const T* w,
                const T* dy,
                T* dx,
                T* dw,
                T* dbias,
                int64_t n,
                int64_t k,
                int64_t m,
                bool accumulate_dx,
                bool accumulate_dw) {
    blas_use_one_thread();
    const int64_t tile_rows = chunk_count(m, kTile), tile_cols = std::max<int64_t>(chunk_count(k, kTile), 1);
    // dw null (grouped_linear_bwd's dx-only call; no bias then): the dx chunks alone.
    const int64_t dw_tasks = dw ? tile_rows * tile_cols : 0, dx_tasks = dx ? chunk_count(n, kRowChunk) : 0;
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
        gemm(true, false, outs, cols, n, T(1), dy + o0, m, x + c0, k, T(accumulate_dw ? 1 : 0), dw + o0 * k + c0, k);
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
    const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t, bool, bool);
template void linear_bwd<double>(
    const double*, const double*, const double*, double*, double*, double*, int64_t, int64_t, int64_t, bool, bool);

// The CPU kernel of ops::linear_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
    constexpr std::string_view op = "linear_fwd";
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 2);
    check_float_arg(y, op, "y", 2);
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(y, x, op, "y", "x");
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    check_shape(w, {m, k}, op, "w");
    check_shape(y, {n, m}, op, "y");
    if (bias.defined()) {
        check_float_arg(bias, op, "bias", 1);
        check_dtype_as(bias, x, op, "bias", "x");
        check_shape(bias, {m}, op, "bias");
    }
    MT_DISPATCH_FLOAT(
        x.dtype(),
        op,
        cpu::linear_fwd(
            x.data<scalar_t>(), w.data<scalar_t>(), data_or_null<scalar_t>(bias), y.data<scalar_t>(), n, k, m));
}
MT_REGISTER_KERNEL(linear_fwd, cpu, linear_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::linear_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void linear_bwd(const Tensor& x,
                const Tensor& w,
                const Tensor& dy,
                const Tensor& dx,
                const Tensor& dw,
                const Tensor& dbias,
                bool accumulate_dx,
                bool accumulate_dw) {
    constexpr std::string_view op = "linear_bwd";
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 2);
    check_float_arg(dy, op, "dy", 2);
    check_float_arg(dw, op, "dw", 2);
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dw, x, op, "dw", "x");
    const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
    check_shape(w, {m, k}, op, "w");
    check_shape(dy, {n, m}, op, "dy");
    check_shape(dw, {m, k}, op, "dw");
    if (dx.defined()) {
        check_float_arg(dx, op, "dx", 2);
        check_dtype_as(dx, x, op, "dx", "x");
        check_shape(dx, {n, k}, op, "dx");
    }
    if (dbias.defined()) {
        check_float_arg(dbias, op, "dbias", 1);
        check_dtype_as(dbias, x, op, "dbias", "x");
        check_shape(dbias, {m}, op, "dbias");
    }
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::linear_bwd(x.data<scalar_t>(),
                                      w.data<scalar_t>(),
                                      dy.data<scalar_t>(),
                                      data_or_null<scalar_t>(dx),
                                      dw.data<scalar_t>(),
                                      data_or_null<scalar_t>(dbias),
                                      n,
                                      k,
                                      m,
                                      accumulate_dx,
                                      accumulate_dw));
}
MT_REGISTER_KERNEL(linear_bwd, cpu, linear_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
