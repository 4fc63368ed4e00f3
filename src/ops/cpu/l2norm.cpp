// CPU reference of the row L2 norm (ops/l2norm.h): rows are independent, parallel over fixed row blocks.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kda_kernels.h"
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kRowBlock = 64;
}

template <typename T>
void l2norm_fwd(const T* x, T* y, T* rinv, int64_t n, int64_t c, double scale, double eps) {
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t r = blk * kRowBlock; r < std::min(n, (blk + 1) * kRowBlock); ++r) {
            const T* xr = x + r * c;
            T ss = 0;
            for (int64_t i = 0; i < c; ++i) ss += xr[i] * xr[i];
            const T inv = T(1) / std::sqrt(ss + static_cast<T>(eps));
            rinv[r] = inv;
            const T f = static_cast<T>(scale) * inv;
            for (int64_t i = 0; i < c; ++i) y[r * c + i] = xr[i] * f;
        }
    }
}

template <typename T>
void l2norm_bwd(const T* x, const T* rinv, const T* dy, T* dx, int64_t n, int64_t c, double scale) {
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t r = blk * kRowBlock; r < std::min(n, (blk + 1) * kRowBlock); ++r) {
            const T *xr = x + r * c, *dyr = dy + r * c, inv = rinv[r];
            T dot = 0;  // xh . dy
            for (int64_t i = 0; i < c; ++i) dot += xr[i] * inv * dyr[i];
            const T f = static_cast<T>(scale) * inv;
            for (int64_t i = 0; i < c; ++i) dx[r * c + i] = f * (dyr[i] - xr[i] * inv * dot);
        }
    }
}

template void l2norm_fwd<float>(const float*, float*, float*, int64_t, int64_t, double, double);
template void l2norm_fwd<double>(const double*, double*, double*, int64_t, int64_t, double, double);
template void l2norm_bwd<float>(const float*, const float*, const float*, float*, int64_t, int64_t, double);
template void l2norm_bwd<double>(const double*, const double*, const double*, double*, int64_t, int64_t, double);

}  // namespace mt::ops::cpu
