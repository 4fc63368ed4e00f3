// CPU reference of the SwiGLU gate, elementwise over flat buffers.
#include <cmath>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 4096;  // elements per parallel task
}

// out = g * sigmoid(g) * u
template <typename T>
void swiglu_fwd(const T* gate, const T* up, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            const T g = gate[i];
            const T sig = T(1) / (T(1) + std::exp(-g));
            out[i] = g * sig * up[i];
        }
    }
}

// dgate = dout * u * sigmoid(g) * (1 + g (1 - sigmoid(g))),  dup = dout * g * sigmoid(g)
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            const T g = gate[i], u = up[i], d = dout[i];
            const T sig = T(1) / (T(1) + std::exp(-g));
            dgate[i] = d * u * sig * (T(1) + g * (T(1) - sig));
            dup[i] = d * g * sig;
        }
    }
}

template void swiglu_fwd<float>(const float*, const float*, float*, int64_t);
template void swiglu_fwd<double>(const double*, const double*, double*, int64_t);
template void swiglu_bwd<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void swiglu_bwd<double>(const double*, const double*, const double*, double*, double*, int64_t);

}  // namespace mt::ops::cpu
