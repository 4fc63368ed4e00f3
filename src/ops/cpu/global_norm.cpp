// CPU reference of the sum of squares behind the global gradient norm, deterministic for any thread count.
#include <cstddef>
#include <vector>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

// Block sums in parallel (each block of kNormBlock elements summed in order, in f64), then the block sums in
// block order.
template <typename T>
double sum_squares(const T* x, int64_t n) {
    const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kNormBlock + kNormBlock < n ? blk * kNormBlock + kNormBlock : n;
        double sum = 0.0;
        for (int64_t i = blk * kNormBlock; i < end; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
        partial[static_cast<size_t>(blk)] = sum;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace mt::ops::cpu
