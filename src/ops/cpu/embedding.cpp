// CPU reference of the embedding lookup and its scatter-add backward.
#include <algorithm>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kColumnBlock = 64;  // columns of dweight owned by one task in the backward
}

// out[i, :] = weight[ids[i], :]
template <typename T>
void embedding_fwd(const int32_t* ids, const T* weight, T* out, int64_t n, int64_t c) {
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* src = weight + static_cast<int64_t>(ids[i]) * c;  // [c]
        std::copy(src, src + c, out + i * c);
    }
}

// dweight[ids[i], :] += dout[i, :]. Rows repeat, so threads split the columns instead: each task owns a column
// block of every row and adds the positions in order i = 0, 1, ..., which keeps the sum deterministic.
template <typename T>
void embedding_bwd(const int32_t* ids, const T* dout, T* dweight, int64_t n, int64_t c) {
    const int64_t blocks = (c + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (n * c >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t c0 = blk * kColumnBlock, c1 = std::min(c, c0 + kColumnBlock);
        for (int64_t i = 0; i < n; ++i) {
            const T* src = dout + i * c;                          // [c]
            T* dst = dweight + static_cast<int64_t>(ids[i]) * c;  // [c]
            for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
        }
    }
}

template void embedding_fwd<float>(const int32_t*, const float*, float*, int64_t, int64_t);
template void embedding_fwd<double>(const int32_t*, const double*, double*, int64_t, int64_t);
template void embedding_bwd<float>(const int32_t*, const float*, float*, int64_t, int64_t);
template void embedding_bwd<double>(const int32_t*, const double*, double*, int64_t, int64_t);

}  // namespace mt::ops::cpu
