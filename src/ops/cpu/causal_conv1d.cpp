// CPU reference of the causal depthwise conv (ops/causal_conv1d.h). One task per block of channels walks every
// (batch, time) row in order, so dw has a fixed summation order for any thread count.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kda_kernels.h"
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {

constexpr int64_t kChannelBlock = 16;

// Pre-activation z[b, t, ch] = sum_tau w[ch, tau] x[b, t - W + 1 + tau, ch].
template <typename T>
T conv_at(const T* x, const T* w, int64_t bb, int64_t t, int64_t ch, int64_t tl, int64_t c, int64_t width) {
    T z = 0;
    for (int64_t tau = std::max<int64_t>(0, width - 1 - t); tau < width; ++tau)
        z += w[ch * width + tau] * x[(bb * tl + t - width + 1 + tau) * c + ch];
    return z;
}

template <typename T>
T sigmoid(T z) {
    return z >= 0 ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
}

}  // namespace

template <typename T>
void causal_conv1d_fwd(const T* x, const T* w, T* y, int64_t b, int64_t t, int64_t c, int64_t width, bool silu) {
    const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (b * t * c * width >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c1 = std::min(c, (blk + 1) * kChannelBlock);
        for (int64_t bb = 0; bb < b; ++bb) {
            for (int64_t tt = 0; tt < t; ++tt) {
                for (int64_t ch = blk * kChannelBlock; ch < c1; ++ch) {
                    const T z = conv_at(x, w, bb, tt, ch, t, c, width);
                    y[(bb * t + tt) * c + ch] = silu ? z * sigmoid(z) : z;
                }
            }
        }
    }
}

// dz = dy * silu'(z), silu'(z) = s (1 + z (1 - s)), s = sigmoid(z);
// dx[t - W + 1 + tau] += w[tau] dz[t];  dw[tau] += sum_{b, t} dz[t] x[t - W + 1 + tau]
template <typename T>
void causal_conv1d_bwd(
    const T* x, const T* w, const T* dy, T* dx, T* dw, int64_t b, int64_t t, int64_t c, int64_t width, bool silu) {
    const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (b * t * c * width >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kChannelBlock, c1 = std::min(c, c0 + kChannelBlock);
        for (int64_t bb = 0; bb < b; ++bb)
            for (int64_t tt = 0; tt < t; ++tt)
                for (int64_t ch = c0; ch < c1; ++ch) dx[(bb * t + tt) * c + ch] = 0;
        for (int64_t ch = c0; ch < c1; ++ch) {
            for (int64_t bb = 0; bb < b; ++bb) {
                for (int64_t tt = 0; tt < t; ++tt) {
                    const int64_t i = (bb * t + tt) * c + ch;
                    T dz = dy[i];
                    if (silu) {
                        const T z = conv_at(x, w, bb, tt, ch, t, c, width), s = sigmoid(z);
                        dz *= s * (T(1) + z * (T(1) - s));
                    }
                    for (int64_t tau = std::max<int64_t>(0, width - 1 - tt); tau < width; ++tau) {
                        const int64_t j = (bb * t + tt - width + 1 + tau) * c + ch;
                        dx[j] += w[ch * width + tau] * dz;
                        dw[ch * width + tau] += dz * x[j];
                    }
                }
            }
        }
    }
}

template void causal_conv1d_fwd<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_fwd<double>(
    const double*, const double*, double*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_bwd<float>(
    const float*, const float*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_bwd<double>(
    const double*, const double*, const double*, double*, double*, int64_t, int64_t, int64_t, int64_t, bool);

}  // namespace mt::ops::cpu
