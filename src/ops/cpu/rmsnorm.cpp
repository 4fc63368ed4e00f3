// CPU reference of RMSNorm: one pass per row; the weight gradient sums fixed row blocks, then blocks in order.
#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kRowBlock = 64;  // rows per partial sum of dweight
}

// rstd[i] = 1 / sqrt(mean(x[i, :]^2) + eps);  y[i, :] = x[i, :] * rstd[i] * weight
// With residual (and sum) non-null, x[i, :] + residual[i, :] is written to sum first and normalised in x's place.
template <typename T>
void rmsnorm_fwd(
    const T* x, const T* weight, double eps, T* y, T* rstd, int64_t n, int64_t c, const T* residual, T* sum) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* xr = x + i * c;  // [c]
        if (residual != nullptr) {
            T* hr = sum + i * c;  // [c]; may alias x or residual (each element read before it is written)
            for (int64_t j = 0; j < c; ++j) hr[j] = xr[j] + residual[i * c + j];
            xr = hr;
        }
        T* yr = y + i * c;  // [c]
        T sum_sq = 0;
        for (int64_t j = 0; j < c; ++j) sum_sq += xr[j] * xr[j];
        const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(sum_sq) / static_cast<double>(c) + eps));
        rstd[i] = r;
        for (int64_t j = 0; j < c; ++j) yr[j] = xr[j] * r * weight[j];
    }
}

// With xhat = x * rstd and g = dy * weight (per row):
//   dx = rstd * (g - xhat * mean(g * xhat))       (written; plus dresidual when given, which may alias dx)
//   dweight += sum over rows of dy * xhat         (partial sums per block of kRowBlock rows, added in block order)
template <typename T>
void rmsnorm_bwd(const T* x,
                 const T* weight,
                 const T* rstd,
                 const T* dy,
                 const T* dresidual,
                 T* dx,
                 T* dweight,
                 int64_t n,
                 int64_t c) {
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
    std::vector<T> partial(static_cast<size_t>(blocks * c), T(0));  // [blocks, c]
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T* dw = partial.data() + blk * c;  // [c]
        for (int64_t i = blk * kRowBlock; i < std::min(n, (blk + 1) * kRowBlock); ++i) {
            const T* xr = x + i * c;                                             // [c]
            const T* dyr = dy + i * c;                                           // [c]
            T* dxr = dx + i * c;                                                 // [c]
            const T* dres = dresidual != nullptr ? dresidual + i * c : nullptr;  // [c]
            const T r = rstd[i];
            T dot = 0;  // sum(dy * weight * x)
            for (int64_t j = 0; j < c; ++j) dot += dyr[j] * weight[j] * xr[j];
            const T coef = dot * r * r / static_cast<T>(c);
            for (int64_t j = 0; j < c; ++j) {
                const T g = r * (dyr[j] * weight[j] - xr[j] * coef);
                dxr[j] = dres != nullptr ? dres[j] + g : g;
                dw[j] += dyr[j] * xr[j] * r;
            }
        }
    }
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int64_t j = 0; j < c; ++j) dweight[j] += partial[blk * c + j];
}

template void rmsnorm_fwd<float>(
    const float*, const float*, double, float*, float*, int64_t, int64_t, const float*, float*);
template void rmsnorm_fwd<double>(
    const double*, const double*, double, double*, double*, int64_t, int64_t, const double*, double*);
template void rmsnorm_bwd<float>(
    const float*, const float*, const float*, const float*, const float*, float*, float*, int64_t, int64_t);
template void rmsnorm_bwd<double>(
    const double*, const double*, const double*, const double*, const double*, double*, double*, int64_t, int64_t);

// The CPU kernel of ops::rmsnorm_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rmsnorm_fwd(const Tensor& x,
                 const Tensor& weight,
                 double eps,
                 const Tensor& y,
                 const Tensor& rstd,
                 const Tensor& residual,
                 const Tensor& sum) {
    constexpr std::string_view op = "rmsnorm_fwd";
    const int64_t n = x.size(0), c = x.size(1);
    check_float_arg(x, op, "x", 2);
    check_float_arg(weight, op, "weight", 1);
    check_float_arg(y, op, "y", 2);
    check_float_arg(rstd, op, "rstd", 1);
    check_dtype_as(weight, x, op, "weight", "x");
    check_dtype_as(y, x, op, "y", "x");
    check_dtype_as(rstd, x, op, "rstd", "x");
    if (residual.defined()) check_float_arg(residual, op, "residual", 2), check_float_arg(sum, op, "sum", 2);
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::rmsnorm_fwd(x.data<scalar_t>(),
                                       weight.data<scalar_t>(),
                                       eps,
                                       y.data<scalar_t>(),
                                       rstd.data<scalar_t>(),
                                       n,
                                       c,
                                       residual.defined() ? residual.data<scalar_t>() : nullptr,
                                       sum.defined() ? sum.data<scalar_t>() : nullptr));
}
MT_REGISTER_KERNEL(rmsnorm_fwd, cpu, rmsnorm_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::rmsnorm_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight,
                 const Tensor& dresidual) {
    constexpr std::string_view op = "rmsnorm_bwd";
    const int64_t n = x.size(0), c = x.size(1);
    check_float_arg(x, op, "x", 2);
    check_float_arg(weight, op, "weight", 1);
    check_float_arg(rstd, op, "rstd", 1);
    check_float_arg(dy, op, "dy", 2);
    check_float_arg(dx, op, "dx", 2);
    check_float_arg(dweight, op, "dweight", 1);
    check_dtype_as(weight, x, op, "weight", "x");
    check_dtype_as(rstd, x, op, "rstd", "x");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_dtype_as(dweight, x, op, "dweight", "x");
    if (dresidual.defined()) check_dtype_as(dresidual, x, op, "dresidual", "x");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::rmsnorm_bwd(x.data<scalar_t>(),
                                       weight.data<scalar_t>(),
                                       rstd.data<scalar_t>(),
                                       dy.data<scalar_t>(),
                                       dresidual.defined() ? dresidual.data<scalar_t>() : nullptr,
                                       dx.data<scalar_t>(),
                                       dweight.data<scalar_t>(),
                                       n,
                                       c));
}
MT_REGISTER_KERNEL(rmsnorm_bwd, cpu, rmsnorm_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
