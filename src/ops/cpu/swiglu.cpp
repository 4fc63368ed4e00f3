// CPU reference of the SwiGLU gate, elementwise over flat buffers; exp(-gate) is computed a slice at a time into a
// small buffer with the vectorized exp (see vec_math.h).
#include <algorithm>

#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_math.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 4096;  // elements per parallel task
constexpr int64_t kSlice = 256;   // elements per exp buffer
}  // namespace

// out = g * sigmoid(g) * u, sigmoid(g) = 1 / (1 + exp(-g))
template <typename T>
void swiglu_fwd(const T* gate, const T* up, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-g) of one slice
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            const T* g = gate + s0;  // [len]
            exp_affine(g, e, len, T(-1), T(0));
            for (int64_t i = 0; i < len; ++i) out[s0 + i] = g[i] / (T(1) + e[i]) * up[s0 + i];
        }
    }
}

// dgate = dout * u * sigmoid(g) * (1 + g (1 - sigmoid(g))),  dup = dout * g * sigmoid(g)
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-g) of one slice
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            const T* g = gate + s0;  // [len]
            exp_affine(g, e, len, T(-1), T(0));
            for (int64_t i = 0; i < len; ++i) {
                const T sig = T(1) / (T(1) + e[i]), d = dout[s0 + i];
                dgate[s0 + i] = d * up[s0 + i] * sig * (T(1) + g[i] * (T(1) - sig));
                dup[s0 + i] = d * g[i] * sig;
            }
        }
    }
}

template void swiglu_fwd<float>(const float*, const float*, float*, int64_t);
template void swiglu_fwd<double>(const double*, const double*, double*, int64_t);
template void swiglu_bwd<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void swiglu_bwd<double>(const double*, const double*, const double*, double*, double*, int64_t);

}  // namespace mt::ops::cpu
