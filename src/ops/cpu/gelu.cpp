// CPU reference of the exact GELU (ops/gelu.h), elementwise over fixed blocks of elements.
#include "ops/gelu.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {
namespace {
constexpr int64_t kBlock = 4096;
constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
}  // namespace

// y = 0.5 x (1 + erf(x / sqrt(2))); each element is read before it is written, so y may alias x.
template <typename T>
void gelu_fwd(const T* x, T* y, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
            const T v = x[i];
            y[i] = T(0.5) * v * (T(1) + std::erf(v * static_cast<T>(kInvSqrt2)));
        }
    }
}

// dx = dy (Phi(x) + x phi(x)), Phi(x) = 0.5 (1 + erf(x / sqrt(2))), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
template <typename T>
void gelu_bwd(const T* x, const T* dy, T* dx, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
            const T v = x[i];
            const T cdf = T(0.5) * (T(1) + std::erf(v * static_cast<T>(kInvSqrt2)));
            const T pdf = std::exp(T(-0.5) * v * v) * static_cast<T>(kInvSqrt2Pi);
            dx[i] = dy[i] * (cdf + v * pdf);
        }
    }
}

template void gelu_fwd<float>(const float*, float*, int64_t);
template void gelu_fwd<double>(const double*, double*, int64_t);
template void gelu_bwd<float>(const float*, const float*, float*, int64_t);
template void gelu_bwd<double>(const double*, const double*, double*, int64_t);

namespace {

void check_like(const Tensor& t, const Tensor& ref, std::string_view op, const char* name, const char* ref_name) {
    check_float_arg(t, op, name, ref.ndim());
    check_shape(t, ref.shape(), op, name);
    check_dtype_as(t, ref, op, name, ref_name);
}

}  // namespace

// The CPU kernel of ops::gelu_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void gelu_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "gelu_fwd";
    check_float_arg(x, op, "x", x.ndim());
    check_like(y, x, op, "y", "x");
    MT_DISPATCH_FLOAT(x.dtype(), op, cpu::gelu_fwd(x.data<scalar_t>(), y.data<scalar_t>(), x.numel()));
}
MT_REGISTER_KERNEL(gelu_fwd, cpu, gelu_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::gelu_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void gelu_bwd(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "gelu_bwd";
    check_float_arg(x, op, "x", x.ndim());
    check_like(dy, x, op, "dy", "x");
    check_like(dx, x, op, "dx", "x");
    MT_DISPATCH_FLOAT(
        x.dtype(), op, cpu::gelu_bwd(x.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), x.numel()));
}
MT_REGISTER_KERNEL(gelu_bwd, cpu, gelu_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
