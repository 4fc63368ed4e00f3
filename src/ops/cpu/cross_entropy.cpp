// CPU reference of the fused softmax + cross-entropy, one row per task; the backward may run in place.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/kernels.h"
#include "ops/cpu/vec_math.h"

namespace mt::ops::cpu {

// lse[i] = max + log(sum_j exp(logits[i, j] - max));  losses[i] = lse[i] - logits[i, target] (0 if ignored)
template <typename T>
void cross_entropy_fwd(
    const T* logits, const int32_t* targets, int32_t ignore_index, T* losses, T* lse, int64_t n, int64_t v) {
#pragma omp parallel if (n * v >= kParallelMinWork)
    {
        std::vector<T> e(static_cast<size_t>(v));  // [v]: exp(row - max)
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            const T* row = logits + i * v;  // [v]
            const T mx = max_value(row, v);
            exp_affine(row, e.data(), v, T(1), -mx);
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < v; ++j) sum += e[j];
            lse[i] = mx + std::log(sum);
            losses[i] = targets[i] == ignore_index ? T(0) : lse[i] - row[targets[i]];
        }
    }
}

// dlogits[i, :] = dlosses[i] * (exp(logits[i, :] - lse[i]) - onehot(target)), 0 for ignored rows. Each element is
// read before it is written and the one-hot term is applied after the row, so dlogits may alias logits.
template <typename T>
void cross_entropy_bwd(const T* logits,
                       const int32_t* targets,
                       const T* lse,
                       int32_t ignore_index,
                       const T* dlosses,
                       T* dlogits,
                       int64_t n,
                       int64_t v) {
#pragma omp parallel for schedule(static) if (n * v >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* row = logits + i * v;  // [v]
        T* drow = dlogits + i * v;      // [v]
        if (targets[i] == ignore_index) {
            std::fill(drow, drow + v, T(0));
            continue;
        }
        const T scale = dlosses[i];
        exp_affine(row, drow, v, T(1), -lse[i]);
        for (int64_t j = 0; j < v; ++j) drow[j] *= scale;
        drow[targets[i]] -= scale;
    }
}

template void cross_entropy_fwd<float>(const float*, const int32_t*, int32_t, float*, float*, int64_t, int64_t);
template void cross_entropy_fwd<double>(const double*, const int32_t*, int32_t, double*, double*, int64_t, int64_t);
template void cross_entropy_bwd<float>(
    const float*, const int32_t*, const float*, int32_t, const float*, float*, int64_t, int64_t);
template void cross_entropy_bwd<double>(
    const double*, const int32_t*, const double*, int32_t, const double*, double*, int64_t, int64_t);

}  // namespace mt::ops::cpu
