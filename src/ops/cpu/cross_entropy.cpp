// CPU reference of the fused softmax + cross-entropy, one row per task; the backward may run in place.
#include <algorithm>
#include <cmath>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

// lse[i] = max + log(sum_j exp(logits[i, j] - max));  losses[i] = lse[i] - logits[i, target] (0 if ignored)
template <typename T>
void cross_entropy_fwd(
    const T* logits, const int32_t* targets, int32_t ignore_index, T* losses, T* lse, int64_t n, int64_t v) {
#pragma omp parallel for schedule(static) if (n * v >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* row = logits + i * v;  // [v]
        T mx = row[0];
        for (int64_t j = 1; j < v; ++j) mx = std::max(mx, row[j]);
        T sum = 0;
        for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
        lse[i] = mx + std::log(sum);
        losses[i] = targets[i] == ignore_index ? T(0) : lse[i] - row[targets[i]];
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
        const T scale = dlosses[i], l = lse[i];
        for (int64_t j = 0; j < v; ++j) drow[j] = scale * std::exp(row[j] - l);
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
