// CPU reference of the MoE combine: per token, the gate-weighted sum of its rows in slot order, and the backward
// (each buffer row belongs to one slot, so both loops are over tokens without write conflicts).
#include <algorithm>

#include "ops/cpu/kernels.h"

namespace mt::ops::cpu {

// y_i = sum_q g_iq yp[slot_row(i, q)]
template <typename T>
void moe_unpermute_fwd(const T* yp, const int32_t* slot_row, const T* gates, T* y, int64_t n, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static) if (n * k * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        T* out = y + i * c;  // [C]
        std::fill(out, out + c, T(0));
        for (int64_t q = 0; q < k; ++q) {
            const int32_t r = slot_row[i * k + q];
            if (r < 0) continue;
            const T g = gates[i * k + q];
            const T* row = yp + static_cast<int64_t>(r) * c;
            for (int64_t j = 0; j < c; ++j) out[j] += g * row[j];
        }
    }
}

// dyp[slot_row(i, q)] = g_iq dy_i; dgates_iq = dy_i . yp[slot_row(i, q)] (0 when dropped). Rows no slot names are 0.
template <typename T>
void moe_unpermute_bwd(const T* yp,
                       const int32_t* slot_row,
                       const T* gates,
                       const T* dy,
                       T* dyp,
                       T* dgates,
                       int64_t n,
                       int64_t k,
                       int64_t c,
                       int64_t rows) {
    std::fill(dyp, dyp + rows * c, T(0));
#pragma omp parallel for schedule(static) if (n * k * c >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* d = dy + i * c;  // [C]
        for (int64_t q = 0; q < k; ++q) {
            const int32_t r = slot_row[i * k + q];
            if (r < 0) {
                dgates[i * k + q] = T(0);
                continue;
            }
            const T g = gates[i * k + q];
            const T* row = yp + static_cast<int64_t>(r) * c;
            T* drow = dyp + static_cast<int64_t>(r) * c;
            T dot = 0;
            for (int64_t j = 0; j < c; ++j) {
                dot += d[j] * row[j];
                drow[j] = g * d[j];
            }
            dgates[i * k + q] = dot;
        }
    }
}

#define MT_INSTANTIATE(T)                                                                                  \
    template void moe_unpermute_fwd<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t); \
    template void moe_unpermute_bwd<T>(                                                                    \
        const T*, const int32_t*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t, int64_t);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::ops::cpu
