// CPU reference of LayerNorm: two passes per row (the mean, then the centred variance); the weight and bias gradients
// sum fixed row blocks, then the blocks in order.
#include "ops/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kRowBlock = 64;  // rows per partial sum of dweight and dbias
}

// mean[i] = sum(x[i, :]) / c;  rstd[i] = 1 / sqrt(sum((x[i, :] - mean[i])^2) / c + eps)
// y[i, :] = (x[i, :] - mean[i]) * rstd[i] * weight + bias
template <typename T>
void layernorm_fwd(
    const T* x, const T* weight, const T* bias, double eps, T* y, T* mean, T* rstd, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* xr = x + i * c;  // [c]
        T* yr = y + i * c;        // [c]
        T sum = 0;
        for (int64_t j = 0; j < c; ++j) sum += xr[j];
        const T mu = sum / static_cast<T>(c);
        T sum_sq = 0;
        for (int64_t j = 0; j < c; ++j) sum_sq += (xr[j] - mu) * (xr[j] - mu);
        const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(sum_sq) / static_cast<double>(c) + eps));
        mean[i] = mu;
        rstd[i] = r;
        for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mu) * r * weight[j] + bias[j];
    }
}

// With xhat = (x - mean) * rstd and g = dy * weight (per row):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (written; plus dresidual when given, which may alias dx)
//   dweight += sum over rows of dy * xhat;  dbias += sum over rows of dy
//   (partial sums per block of kRowBlock rows, added in block order)
template <typename T>
void layernorm_bwd(const T* x,
                   const T* weight,
                   const T* mean,
                   const T* rstd,
                   const T* dy,
                   const T* dresidual,
                   T* dx,
                   T* dweight,
                   T* dbias,
                   int64_t n,
                   int64_t c) {
    const int64_t blocks = (n + kRowBlock - 1) / kRowBlock;
    std::vector<T> partial(static_cast<size_t>(blocks * 2 * c), T(0));  // [blocks, 2, c]: dweight, dbias
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T* dw = partial.data() + blk * 2 * c;  // [c]
        T* db = dw + c;                        // [c]
        for (int64_t i = blk * kRowBlock; i < std::min(n, (blk + 1) * kRowBlock); ++i) {
            const T* xr = x + i * c;                                             // [c]
            const T* dyr = dy + i * c;                                           // [c]
            T* dxr = dx + i * c;                                                 // [c]
            const T* dres = dresidual != nullptr ? dresidual + i * c : nullptr;  // [c]
            const T mu = mean[i], r = rstd[i];
            T sum_g = 0, sum_gx = 0;  // sum(g), sum(g * xhat)
            for (int64_t j = 0; j < c; ++j) {
                const T g = dyr[j] * weight[j];
                sum_g += g;
                sum_gx += g * (xr[j] - mu) * r;
            }
            const T mean_g = sum_g / static_cast<T>(c), mean_gx = sum_gx / static_cast<T>(c);
            for (int64_t j = 0; j < c; ++j) {
                const T xhat = (xr[j] - mu) * r;
                const T g = r * (dyr[j] * weight[j] - mean_g - xhat * mean_gx);
                dxr[j] = dres != nullptr ? dres[j] + g : g;
                dw[j] += dyr[j] * xhat;
                db[j] += dyr[j];
            }
        }
    }
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int64_t j = 0; j < c; ++j) {
            dweight[j] += partial[blk * 2 * c + j];
            dbias[j] += partial[blk * 2 * c + c + j];
        }
}

template void layernorm_fwd<float>(
    const float*, const float*, const float*, double, float*, float*, float*, int64_t, int64_t);
template void layernorm_fwd<double>(
    const double*, const double*, const double*, double, double*, double*, double*, int64_t, int64_t);
template void layernorm_bwd<float>(const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   const float*,
                                   float*,
                                   float*,
                                   float*,
                                   int64_t,
                                   int64_t);
template void layernorm_bwd<double>(const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    const double*,
                                    double*,
                                    double*,
                                    double*,
                                    int64_t,
                                    int64_t);

// The CPU kernel of ops::layernorm_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void layernorm_fwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& bias,
                   double eps,
                   const Tensor& y,
                   const Tensor& mean,
                   const Tensor& rstd) {
    constexpr std::string_view op = "layernorm_fwd";
    const int64_t n = x.size(0), c = x.size(1);
    check_float_arg(x, op, "x", 2);
    check_float_arg(weight, op, "weight", 1);
    check_float_arg(bias, op, "bias", 1);
    check_float_arg(y, op, "y", 2);
    check_float_arg(mean, op, "mean", 1);
    check_float_arg(rstd, op, "rstd", 1);
    check_dtype_as(weight, x, op, "weight", "x");
    check_dtype_as(bias, x, op, "bias", "x");
    check_dtype_as(y, x, op, "y", "x");
    check_dtype_as(mean, x, op, "mean", "x");
    check_dtype_as(rstd, x, op, "rstd", "x");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::layernorm_fwd(x.data<scalar_t>(),
                                         weight.data<scalar_t>(),
                                         bias.data<scalar_t>(),
                                         eps,
                                         y.data<scalar_t>(),
                                         mean.data<scalar_t>(),
                                         rstd.data<scalar_t>(),
                                         n,
                                         c));
}
MT_REGISTER_KERNEL(layernorm_fwd, cpu, layernorm_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::layernorm_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void layernorm_bwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& mean,
                   const Tensor& rstd,
                   const Tensor& dy,
                   const Tensor& dx,
                   const Tensor& dweight,
                   const Tensor& dbias,
                   const Tensor& dresidual) {
    constexpr std::string_view op = "layernorm_bwd";
    const int64_t n = x.size(0), c = x.size(1);
    check_float_arg(x, op, "x", 2);
    check_float_arg(weight, op, "weight", 1);
    check_float_arg(mean, op, "mean", 1);
    check_float_arg(rstd, op, "rstd", 1);
    check_float_arg(dy, op, "dy", 2);
    check_float_arg(dx, op, "dx", 2);
    check_float_arg(dweight, op, "dweight", 1);
    check_float_arg(dbias, op, "dbias", 1);
    check_dtype_as(weight, x, op, "weight", "x");
    check_dtype_as(mean, x, op, "mean", "x");
    check_dtype_as(rstd, x, op, "rstd", "x");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_dtype_as(dweight, x, op, "dweight", "x");
    check_dtype_as(dbias, x, op, "dbias", "x");
    if (dresidual.defined()) {
        check_float_arg(dresidual, op, "dresidual", 2);
        check_dtype_as(dresidual, x, op, "dresidual", "x");
    }
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::layernorm_bwd(x.data<scalar_t>(),
                                         weight.data<scalar_t>(),
                                         mean.data<scalar_t>(),
                                         rstd.data<scalar_t>(),
                                         dy.data<scalar_t>(),
                                         dresidual.defined() ? dresidual.data<scalar_t>() : nullptr,
                                         dx.data<scalar_t>(),
                                         dweight.data<scalar_t>(),
                                         dbias.data<scalar_t>(),
                                         n,
                                         c));
}
MT_REGISTER_KERNEL(layernorm_bwd, cpu, layernorm_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
