// CPU reference of the sigmoid gate (ops/sigmoid_gate.h), over fixed blocks of elements.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kda_kernels.h"
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {

constexpr int64_t kBlock = 4096;

template <typename T>
T sigmoid(T z) {
    return z >= 0 ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
}

}  // namespace

template <typename T>
void sigmoid_gate_fwd(const T* x, const T* z, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) out[i] = x[i] * sigmoid(z[i]);
    }
}

template <typename T>
void sigmoid_gate_bwd(const T* x, const T* z, const T* dout, T* dx, T* dz, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
            const T s = sigmoid(z[i]);
            dx[i] = dout[i] * s;
            dz[i] = dout[i] * x[i] * s * (T(1) - s);
        }
    }
}

template void sigmoid_gate_fwd<float>(const float*, const float*, float*, int64_t);
template void sigmoid_gate_fwd<double>(const double*, const double*, double*, int64_t);
template void sigmoid_gate_bwd<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void sigmoid_gate_bwd<double>(const double*, const double*, const double*, double*, double*, int64_t);

}  // namespace mt::ops::cpu
