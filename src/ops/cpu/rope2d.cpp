// CPU reference of the 2-D rotary position embedding (ops/rope2d.h): per token, the D/2 angles (D/4 by the row
// index, D/4 by the column index) are computed in f64, then every head of the token is rotated.
#include "ops/rope2d.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

// For each token t, half h (offset o = h D/2, index p = rows[t] for h = 0, cols[t] for h = 1) and i < D/4, with
// angle = p * theta^(-2i/(D/2)), c = cos(angle), s = sin(angle) (s = -sin(angle) for the inverse):
//   y[o + i] = x[o + i] c - x[o + i + D/4] s,   y[o + i + D/4] = x[o + i + D/4] c + x[o + i] s
// Each pair is read before it is written, so y may alias x.
template <typename T>
void rope2d_rotate(const T* x,
                   T* y,
                   const int32_t* rows,
                   const int32_t* cols,
                   int64_t t,
                   int64_t h,
                   int64_t d,
                   double theta,
                   bool inverse) {
    const int64_t half = d / 2, quarter = d / 4;
    std::vector<double> freq(static_cast<size_t>(quarter));  // theta^(-2i/(D/2)), as rope's for a head of D/2
    for (int64_t i = 0; i < quarter; ++i)
        freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(half));
#pragma omp parallel for schedule(static) if (t * h * d >= kParallelMinWork)
    for (int64_t tt = 0; tt < t; ++tt) {
        std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));  // [2, D/4]: by row, by column
        for (int64_t part = 0; part < 2; ++part) {
            const double p = static_cast<double>(part == 0 ? rows[tt] : cols[tt]);
            for (int64_t i = 0; i < quarter; ++i) {
                const double angle = p * freq[i];
                cs[part * quarter + i] = static_cast<T>(std::cos(angle));
                sn[part * quarter + i] = static_cast<T>(inverse ? -std::sin(angle) : std::sin(angle));
            }
        }
        for (int64_t hh = 0; hh < h; ++hh) {
            const T* xr = x + (tt * h + hh) * d;  // [d]
            T* yr = y + (tt * h + hh) * d;        // [d]
            for (int64_t part = 0; part < 2; ++part) {
                const int64_t o = part * half;
                const T* c = cs.data() + part * quarter;  // [D/4]
                const T* s = sn.data() + part * quarter;  // [D/4]
                for (int64_t i = 0; i < quarter; ++i) {
                    const T lo = xr[o + i], hi = xr[o + i + quarter];
                    yr[o + i] = lo * c[i] - hi * s[i];
                    yr[o + i + quarter] = hi * c[i] + lo * s[i];
                }
            }
        }
    }
}

template void rope2d_rotate<float>(
    const float*, float*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t, double, bool);
template void rope2d_rotate<double>(
    const double*, double*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t, double, bool);

namespace {

void rope2d_run(const Tensor& in,
                const Tensor& rows,
                const Tensor& cols,
                const Tensor& out,
                double theta,
                bool inverse,
                std::string_view op,
                std::string_view in_arg,
                std::string_view out_arg) {
    check_float_arg(in, op, in_arg, 3);
    check_float_arg(out, op, out_arg, 3);
    check_dtype_as(out, in, op, out_arg, in_arg);
    MT_DISPATCH_FLOAT(in.dtype(),
                      op,
                      cpu::rope2d_rotate(in.data<scalar_t>(),
                                         out.data<scalar_t>(),
                                         rows.data<int32_t>(),
                                         cols.data<int32_t>(),
                                         in.size(0),
                                         in.size(1),
                                         in.size(2),
                                         theta,
                                         inverse));
}

}  // namespace

// The CPU kernel of ops::rope2d_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rope2d_fwd(const Tensor& x, const Tensor& rows, const Tensor& cols, const Tensor& y, double theta) {
    rope2d_run(x, rows, cols, y, theta, false, "rope2d_fwd", "x", "y");
}
MT_REGISTER_KERNEL(rope2d_fwd, cpu, rope2d_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::rope2d_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rope2d_bwd(const Tensor& dy, const Tensor& rows, const Tensor& cols, const Tensor& dx, double theta) {
    rope2d_run(dy, rows, cols, dx, theta, true, "rope2d_bwd", "dy", "dx");
}
MT_REGISTER_KERNEL(rope2d_bwd, cpu, rope2d_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
