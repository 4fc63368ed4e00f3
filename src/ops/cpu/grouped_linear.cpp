// CPU reference of the grouped linear op: a loop over the non-empty experts, each calling the linear op's reference
// on its contiguous rows (OpenBLAS GEMMs over fixed row chunks and weight tiles, OpenMP inside each call).
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

template <typename T>
void grouped_linear_fwd(const T* x, const T* w, const int32_t* offsets, T* y, int64_t e, int64_t k, int64_t m) {
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) continue;
        linear_fwd<T>(x + r0 * k, w + j * m * k, nullptr, y + r0 * m, rows, k, m);
    }
}

template <typename T>
void grouped_linear_bwd(
    const T* x, const T* w, const int32_t* offsets, const T* dy, T* dx, T* dw, int64_t e, int64_t k, int64_t m) {
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) continue;
        linear_bwd<T>(x + r0 * k,
                      w + j * m * k,
                      dy + r0 * m,
                      dx ? dx + r0 * k : nullptr,
                      dw + j * m * k,
                      nullptr,
                      rows,
                      k,
                      m,
                      false);
    }
}

template void grouped_linear_fwd<float>(const float*, const float*, const int32_t*, float*, int64_t, int64_t, int64_t);
template void grouped_linear_fwd<double>(
    const double*, const double*, const int32_t*, double*, int64_t, int64_t, int64_t);
template void grouped_linear_bwd<float>(
    const float*, const float*, const int32_t*, const float*, float*, float*, int64_t, int64_t, int64_t);
template void grouped_linear_bwd<double>(
    const double*, const double*, const int32_t*, const double*, double*, double*, int64_t, int64_t, int64_t);

}  // namespace mt::ops::cpu
