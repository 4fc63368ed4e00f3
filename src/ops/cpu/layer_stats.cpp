// CPU reference of the per-layer statistics (ops/layer_stats.h): f64 sums over fixed blocks, each summed in order,
// then the block sums in block order, so the result does not depend on the thread count.
#include "ops/layer_stats.h"

#include <cmath>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 4096;  // elements (moments) or rows (mix) per block
}

// out += {n, sum x, sum x^2, #(x <= low)} over x [n].
template <typename T>
void layer_stats_moments(const T* x, int64_t n, double low, double* out) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(static_cast<size_t>(3 * blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        double sum = 0.0, sq = 0.0, below = 0.0;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            const auto v = static_cast<double>(x[i]);
            sum += v;
            sq += v * v;
            below += v <= low ? 1.0 : 0.0;
        }
        double* p = &partial[static_cast<size_t>(3 * blk)];
        p[0] = sum, p[1] = sq, p[2] = below;
    }
    out[0] += static_cast<double>(n);
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int k = 0; k < 3; ++k) out[1 + k] += partial[static_cast<size_t>(3 * blk + k)];
}

// out += {rows, sum over rows of each column, sum over rows of the row's entropy} over alpha [rows, m].
template <typename T>
void layer_stats_mix(const T* alpha, int64_t rows, int64_t m, double* out) {
    const int64_t blocks = (rows + kBlock - 1) / kBlock, width = m + 1;
    std::vector<double> partial(static_cast<size_t>(width * blocks), 0.0);
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < rows ? blk * kBlock + kBlock : rows;
        double* p = &partial[static_cast<size_t>(width * blk)];
        for (int64_t n = blk * kBlock; n < end; ++n) {
            double entropy = 0.0;
            for (int64_t j = 0; j < m; ++j) {
                const auto a = static_cast<double>(alpha[n * m + j]);
                p[j] += a;
                if (a > 0.0) entropy -= a * std::log(a);
            }
            p[m] += entropy;
        }
    }
    out[0] += static_cast<double>(rows);
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int64_t k = 0; k < width; ++k) out[1 + k] += partial[static_cast<size_t>(width * blk + k)];
}

// The CPU kernels of ops::layer_stats_* (registered in the op registry): the CPU dtypes, then the float dispatch.
void layer_stats_moments(const Tensor& x, double low, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_moments";
    check_float_arg(x, op, "x", x.ndim());
    MT_DISPATCH_FLOAT(x.dtype(), op, layer_stats_moments(x.data<scalar_t>(), x.numel(), low, out.data<double>()));
}
MT_REGISTER_KERNEL(layer_stats_moments, cpu, layer_stats_moments, ::mt::ops::float_dtypes);

void layer_stats_mix(const Tensor& alpha, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_mix";
    check_float_arg(alpha, op, "alpha", 2);
    MT_DISPATCH_FLOAT(
        alpha.dtype(), op, layer_stats_mix(alpha.data<scalar_t>(), alpha.size(0), alpha.size(1), out.data<double>()));
}
MT_REGISTER_KERNEL(layer_stats_mix, cpu, layer_stats_mix, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
