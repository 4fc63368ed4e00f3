// CPU reference of the row L2 norm (ops/l2norm.h): rows are independent, parallel over fixed row blocks.
#include "ops/l2norm.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

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

namespace {

void check_like_x(const Tensor& t, const Tensor& x, std::string_view op, const char* name) {
    check_float_arg(t, op, name, 2);
    check_shape(t, x.shape(), op, name);
    check_dtype_as(t, x, op, name, "x");
}

void check_l2(const Tensor& x, const Tensor& rinv, std::string_view op) {
    check_float_arg(x, op, "x", 2);
    MT_CHECK(x.size(1) > 0, "{}: x has shape {}; the normalized dim C must be > 0", op, core::shape_str(x.shape()));
    check_float_arg(rinv, op, "rinv", 1);
    check_shape(rinv, {x.size(0)}, op, "rinv");
    check_dtype_as(rinv, x, op, "rinv", "x");
}

}  // namespace

// The CPU kernel of ops::l2norm_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void l2norm_fwd(const Tensor& x, double scale, double eps, const Tensor& y, const Tensor& rinv) {
    constexpr std::string_view op = "l2norm_fwd";
    check_l2(x, rinv, op);
    check_like_x(y, x, op, "y");
    MT_DISPATCH_FLOAT(
        x.dtype(),
        op,
        cpu::l2norm_fwd(
            x.data<scalar_t>(), y.data<scalar_t>(), rinv.data<scalar_t>(), x.size(0), x.size(1), scale, eps));
}
MT_REGISTER_KERNEL(l2norm_fwd, cpu, l2norm_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::l2norm_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void l2norm_bwd(const Tensor& x, const Tensor& rinv, double scale, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "l2norm_bwd";
    check_l2(x, rinv, op);
    check_like_x(dy, x, op, "dy");
    check_like_x(dx, x, op, "dx");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::l2norm_bwd(x.data<scalar_t>(),
                                      rinv.data<scalar_t>(),
                                      dy.data<scalar_t>(),
                                      dx.data<scalar_t>(),
                                      x.size(0),
                                      x.size(1),
                                      scale));
}
MT_REGISTER_KERNEL(l2norm_bwd, cpu, l2norm_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
