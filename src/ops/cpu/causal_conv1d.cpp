// CPU reference of the causal depthwise conv (ops/causal_conv1d.h). One task per block of channels walks every
// (batch, time) row in order, so dw has a fixed summation order for any thread count.
#include "ops/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"
#include "ops/registry.h"

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

// z[ch] and sigmoid(z[ch]) = 1 / (1 + exp(-z)) of one row's channels [c0, c1) (the exp vectorized, vec_math.h).
template <typename T>
void row_silu_parts(const T* x,
                    const T* w,
                    int64_t bb,
                    int64_t tt,
                    int64_t c0,
                    int64_t c1,
                    int64_t t,
                    int64_t c,
                    int64_t width,
                    T* z,
                    T* s) {
    for (int64_t ch = c0; ch < c1; ++ch) z[ch - c0] = conv_at(x, w, bb, tt, ch, t, c, width);
    exp_affine(z, s, c1 - c0, T(-1), T(0));
    for (int64_t j = 0; j < c1 - c0; ++j) s[j] = T(1) / (T(1) + s[j]);
}

}  // namespace

template <typename T>
void causal_conv1d_fwd(const T* x, const T* w, T* y, int64_t b, int64_t t, int64_t c, int64_t width, bool silu) {
    const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (b * t * c * width >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kChannelBlock, c1 = std::min(c, c0 + kChannelBlock);
        T z[kChannelBlock], s[kChannelBlock];
        for (int64_t bb = 0; bb < b; ++bb) {
            for (int64_t tt = 0; tt < t; ++tt) {
                T* yr = y + (bb * t + tt) * c;
                if (silu) {
                    row_silu_parts(x, w, bb, tt, c0, c1, t, c, width, z, s);
                    for (int64_t ch = c0; ch < c1; ++ch) yr[ch] = z[ch - c0] * s[ch - c0];
                } else {
                    for (int64_t ch = c0; ch < c1; ++ch) yr[ch] = conv_at(x, w, bb, tt, ch, t, c, width);
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
        // Rows outer, the block's channels inner (each row's 16 channels are adjacent), dw in a block-local copy:
        // every dx and dw element still gets its terms in the same order as a loop over one channel at a time.
        std::vector<T> dwb(dw + c0 * width, dw + c1 * width);
        T z[kChannelBlock], s[kChannelBlock];
        for (int64_t bb = 0; bb < b; ++bb) {
            for (int64_t tt = 0; tt < t; ++tt) {
                if (silu) row_silu_parts(x, w, bb, tt, c0, c1, t, c, width, z, s);
                for (int64_t ch = c0; ch < c1; ++ch) {
                    const int64_t i = (bb * t + tt) * c + ch;
                    T dz = dy[i];
                    if (silu) {
                        const T zc = z[ch - c0], sc = s[ch - c0];
                        dz *= sc * (T(1) + zc * (T(1) - sc));
                    }
                    T* dwc = dwb.data() + (ch - c0) * width;
                    for (int64_t tau = std::max<int64_t>(0, width - 1 - tt); tau < width; ++tau) {
                        const int64_t j = (bb * t + tt - width + 1 + tau) * c + ch;
                        dx[j] += w[ch * width + tau] * dz;
                        dwc[tau] += dz * x[j];
                    }
                }
            }
        }
        std::copy(dwb.begin(), dwb.end(), dw + c0 * width);
    }
}

template void causal_conv1d_fwd<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_fwd<double>(
    const double*, const double*, double*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_bwd<float>(
    const float*, const float*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, bool);
template void causal_conv1d_bwd<double>(
    const double*, const double*, const double*, double*, double*, int64_t, int64_t, int64_t, int64_t, bool);

namespace {

void check_like(const Tensor& t, const Tensor& ref, const Tensor& x, std::string_view op, const char* name) {
    check_float_arg(t, op, name, static_cast<int>(ref.ndim()));
    check_shape(t, ref.shape(), op, name);
    check_dtype_as(t, x, op, name, "x");
}

void check_conv(const Tensor& x, const Tensor& w, std::string_view op) {
    check_float_arg(x, op, "x", 3);
    check_float_arg(w, op, "w", 2);
    MT_CHECK(w.size(0) == x.size(2),
             "{}: w has shape {} but x has {} channels; w must be [C, W]",
             op,
             core::shape_str(w.shape()),
             x.size(2));
    MT_CHECK(w.size(1) > 0, "{}: w has shape {}; the width W must be > 0", op, core::shape_str(w.shape()));
    check_dtype_as(w, x, op, "w", "x");
}

}  // namespace

// The CPU kernel of ops::causal_conv1d_fwd (registered in the op registry): the CPU dtypes, then the float
// dispatch.
void causal_conv1d_fwd(const Tensor& x,
                       const Tensor& w,
                       const Tensor& y,
                       bool silu,
                       const Tensor& /*doc_start: the entry point splits the documents*/) {
    constexpr std::string_view op = "causal_conv1d_fwd";
    check_conv(x, w, op);
    check_like(y, x, x, op, "y");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::causal_conv1d_fwd(x.data<scalar_t>(),
                                             w.data<scalar_t>(),
                                             y.data<scalar_t>(),
                                             x.size(0),
                                             x.size(1),
                                             x.size(2),
                                             w.size(1),
                                             silu));
}
MT_REGISTER_KERNEL(causal_conv1d_fwd, cpu, causal_conv1d_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::causal_conv1d_bwd (registered in the op registry): the CPU dtypes, then the float
// dispatch.
void causal_conv1d_bwd(const Tensor& x,
                       const Tensor& w,
                       const Tensor& dy,
                       const Tensor& dx,
                       const Tensor& dw,
                       bool silu,
                       const Tensor& /*doc_start: the entry point splits the documents*/) {
    constexpr std::string_view op = "causal_conv1d_bwd";
    check_conv(x, w, op);
    check_like(dy, x, x, op, "dy");
    check_like(dx, x, x, op, "dx");
    check_like(dw, w, x, op, "dw");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::causal_conv1d_bwd(x.data<scalar_t>(),
                                             w.data<scalar_t>(),
                                             dy.data<scalar_t>(),
                                             dx.data<scalar_t>(),
                                             dw.data<scalar_t>(),
                                             x.size(0),
                                             x.size(1),
                                             x.size(2),
                                             w.size(1),
                                             silu));
}
MT_REGISTER_KERNEL(causal_conv1d_bwd, cpu, causal_conv1d_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
