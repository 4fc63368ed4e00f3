// CPU reference of the residual add and its accumulating backward, elementwise over flat buffers.
#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

namespace {
constexpr int64_t kBlock = 16384;  // elements per parallel task
}

// out = a + b; out may alias a or b (each element is read before it is written).
template <typename T>
void add_fwd(const T* a, const T* b, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) out[i] = a[i] + b[i];
    }
}

// da += dout; db += dout
template <typename T>
void add_bwd(const T* dout, T* da, T* db, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t end = blk * kBlock + kBlock < n ? blk * kBlock + kBlock : n;
        for (int64_t i = blk * kBlock; i < end; ++i) {
            da[i] += dout[i];
            db[i] += dout[i];
        }
    }
}

template void add_fwd<float>(const float*, const float*, float*, int64_t);
template void add_fwd<double>(const double*, const double*, double*, int64_t);
template void add_bwd<float>(const float*, float*, float*, int64_t);
template void add_bwd<double>(const double*, double*, double*, int64_t);

}  // namespace mt::ops::cpu
