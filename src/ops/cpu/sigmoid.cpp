// CPU reference of the elementwise sigmoid (ops/sigmoid.h), over fixed blocks of elements.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kda_kernels.h"
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 4096;
}

template <typename T>
void sigmoid_fwd(const T* x, T* y, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i)
            y[i] = x[i] >= 0 ? T(1) / (T(1) + std::exp(-x[i])) : std::exp(x[i]) / (T(1) + std::exp(x[i]));
    }
}

template <typename T>
void sigmoid_bwd(const T* y, const T* dy, T* dx, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
    }
}

template void sigmoid_fwd<float>(const float*, float*, int64_t);
template void sigmoid_fwd<double>(const double*, double*, int64_t);
template void sigmoid_bwd<float>(const float*, const float*, float*, int64_t);
template void sigmoid_bwd<double>(const double*, const double*, double*, int64_t);

}  // namespace mt::ops::cpu
