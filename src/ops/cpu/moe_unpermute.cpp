// CPU reference of the MoE combine: per token, the gate-weighted sum of its rows in slot order, and the backward
// (each buffer row belongs to one slot, so both loops are over tokens without write conflicts).
#include "ops/moe_unpermute.h"

#include <algorithm>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

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

// The CPU kernel of ops::moe_unpermute_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_unpermute_fwd(const Tensor& yp, const Tensor& slot_row, const Tensor& gates, const Tensor& y) {
    constexpr std::string_view op = "moe_unpermute_fwd";
    const int64_t c = yp.size(1);
    const int64_t n = slot_row.size(0), k = slot_row.size(1);
    check_float_arg(yp, op, "yp", 2);
    check_float_arg(gates, op, "gates", 2);
    check_float_arg(y, op, "y", 2);
    check_dtype_as(gates, yp, op, "gates", "yp");
    check_dtype_as(y, yp, op, "y", "yp");
    MT_DISPATCH_FLOAT(
        yp.dtype(),
        op,
        cpu::moe_unpermute_fwd(
            yp.data<scalar_t>(), slot_row.data<int32_t>(), gates.data<scalar_t>(), y.data<scalar_t>(), n, k, c));
}
MT_REGISTER_KERNEL(moe_unpermute_fwd, cpu, moe_unpermute_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::moe_unpermute_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_unpermute_bwd(const Tensor& yp,
                       const Tensor& slot_row,
                       const Tensor& gates,
                       const Tensor& dy,
                       const Tensor& dyp,
                       const Tensor& dgates) {
    constexpr std::string_view op = "moe_unpermute_bwd";
    check_float_arg(yp, op, "yp", 2);
    check_float_arg(gates, op, "gates", 2);
    check_float_arg(dy, op, "dy", 2);
    check_float_arg(dyp, op, "dyp", 2);
    check_float_arg(dgates, op, "dgates", 2);
    check_dtype_as(gates, yp, op, "gates", "yp");
    check_dtype_as(dy, yp, op, "dy", "yp");
    check_dtype_as(dyp, yp, op, "dyp", "yp");
    check_dtype_as(dgates, yp, op, "dgates", "yp");
    const int64_t rows = yp.size(0), c = yp.size(1);
    const int64_t n = slot_row.size(0), k = slot_row.size(1);
    MT_DISPATCH_FLOAT(yp.dtype(),
                      op,
                      cpu::moe_unpermute_bwd(yp.data<scalar_t>(),
                                             slot_row.data<int32_t>(),
                                             gates.data<scalar_t>(),
                                             dy.data<scalar_t>(),
                                             dyp.data<scalar_t>(),
                                             dgates.data<scalar_t>(),
                                             n,
                                             k,
                                             c,
                                             rows));
}
MT_REGISTER_KERNEL(moe_unpermute_bwd, cpu, moe_unpermute_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
