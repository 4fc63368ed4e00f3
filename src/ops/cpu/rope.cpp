// CPU reference of rotary position embedding ("rotate half" layout); the angles are computed in f64 once per call.
#include "ops/rope.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

// For each (b, t, h) and i < D/2, with angle = (pos_offset + p) * theta^(-2i/D), p = positions[b, t] (or t when
// positions is null), c = cos(angle), s = sin(angle):
//   forward:  y[i] = x[i] c - x[i + D/2] s,   y[i + D/2] = x[i + D/2] c + x[i] s
//   inverse:  y[i] = x[i] c + x[i + D/2] s,   y[i + D/2] = x[i + D/2] c - x[i] s
// The angles come from one [R, D/2] table of positions 0..R-1, R = max(T, position_limit) (every position is below
// R). Each pair is read before
// it is written, so y may alias x.
template <typename T>
void rope_rotate(const T* x,
                 T* y,
                 int64_t b,
                 int64_t t,
                 int64_t h,
                 int64_t d,
                 double theta,
                 int64_t pos_offset,
                 const int32_t* positions,
                 int64_t position_limit,
                 bool inverse) {
    const int64_t half = d / 2, r = std::max(t, position_limit);
    std::vector<T> cos_t(static_cast<size_t>(r * half)), sin_t(static_cast<size_t>(r * half));  // [r, half]
    for (int64_t i = 0; i < half; ++i) {
        const double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        for (int64_t p = 0; p < r; ++p) {
            const double angle = static_cast<double>(pos_offset + p) * freq;
            cos_t[p * half + i] = static_cast<T>(std::cos(angle));
            sin_t[p * half + i] = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
        }
    }
#pragma omp parallel for schedule(static) if (b * t * h * d >= kParallelMinWork)
    for (int64_t bt = 0; bt < b * t; ++bt) {
        const int64_t p = positions ? positions[bt] : bt % t;
        const T* cs = cos_t.data() + p * half;  // [half]
        const T* sn = sin_t.data() + p * half;  // [half]
        for (int64_t hh = 0; hh < h; ++hh) {
            const T* xr = x + (bt * h + hh) * d;  // [d]
            T* yr = y + (bt * h + hh) * d;        // [d]
            for (int64_t i = 0; i < half; ++i) {
                const T lo = xr[i], hi = xr[i + half];
                yr[i] = lo * cs[i] - hi * sn[i];
                yr[i + half] = hi * cs[i] + lo * sn[i];
            }
        }
    }
}

template void rope_rotate<float>(
    const float*, float*, int64_t, int64_t, int64_t, int64_t, double, int64_t, const int32_t*, int64_t, bool);
template void rope_rotate<double>(
    const double*, double*, int64_t, int64_t, int64_t, int64_t, double, int64_t, const int32_t*, int64_t, bool);

// The CPU kernel of ops::rope_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rope_fwd(const Tensor& x,
              double theta,
              int64_t pos_offset,
              const Tensor& y,
              const Tensor& positions,
              int64_t position_limit) {
    constexpr std::string_view op = "rope_fwd";
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::rope_rotate(x.data<scalar_t>(),
                                       y.data<scalar_t>(),
                                       x.size(0),
                                       x.size(1),
                                       x.size(2),
                                       x.size(3),
                                       theta,
                                       pos_offset,
                                       positions.defined() ? positions.data<int32_t>() : nullptr,
                                       position_limit,
                                       false));
}
MT_REGISTER_KERNEL(rope_fwd, cpu, rope_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::rope_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rope_bwd(const Tensor& dy,
              double theta,
              int64_t pos_offset,
              const Tensor& dx,
              const Tensor& positions,
              int64_t position_limit) {
    constexpr std::string_view op = "rope_bwd";
    MT_DISPATCH_FLOAT(dy.dtype(),
                      op,
                      cpu::rope_rotate(dy.data<scalar_t>(),
                                       dx.data<scalar_t>(),
                                       dy.size(0),
                                       dy.size(1),
                                       dy.size(2),
                                       dy.size(3),
                                       theta,
                                       pos_offset,
                                       positions.defined() ? positions.data<int32_t>() : nullptr,
                                       position_limit,
                                       true));
}
MT_REGISTER_KERNEL(rope_bwd, cpu, rope_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
