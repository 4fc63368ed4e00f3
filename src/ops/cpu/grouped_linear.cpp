// CPU reference of the grouped linear op: a loop over the non-empty experts, each calling the linear op's reference
// on its contiguous rows (OpenBLAS GEMMs over fixed row chunks and weight tiles, OpenMP inside each call).
#include "ops/grouped_linear.h"

#include <algorithm>

#include "ops/cpu/checks.h"
#include "ops/cpu/linear.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

template <typename T>
void grouped_linear_fwd(const T* x, const T* w, const int32_t* offsets, T* y, int64_t e, int64_t k, int64_t m) {
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) continue;
        linear_fwd<T>(x + r0 * k, w + j * m * k, nullptr, y + r0 * m, rows, k, m);
    }
}

template <typename T>
void grouped_linear_bwd(const T* x,
                        const T* w,
                        const int32_t* offsets,
                        const T* dy,
                        T* dx,
                        T* dw,
                        int64_t e,
                        int64_t k,
                        int64_t m,
                        bool accumulate_dw) {
    for (int64_t j = 0; j < e; ++j) {
        const int64_t r0 = offsets[j], rows = offsets[j + 1] - r0;
        if (rows == 0) {
            if (dw && !accumulate_dw) std::fill_n(dw + j * m * k, m * k, T(0));  // written: no rows, no gradient
            continue;
        }
        linear_bwd<T>(x + r0 * k,
                      w + j * m * k,
                      dy + r0 * m,
                      dx ? dx + r0 * k : nullptr,
                      dw ? dw + j * m * k : nullptr,
                      nullptr,
                      rows,
                      k,
                      m,
                      false,
                      accumulate_dw);
    }
}

template void grouped_linear_fwd<float>(const float*, const float*, const int32_t*, float*, int64_t, int64_t, int64_t);
template void grouped_linear_fwd<double>(
    const double*, const double*, const int32_t*, double*, int64_t, int64_t, int64_t);
template void grouped_linear_bwd<float>(
    const float*, const float*, const int32_t*, const float*, float*, float*, int64_t, int64_t, int64_t, bool);
template void grouped_linear_bwd<double>(
    const double*, const double*, const int32_t*, const double*, double*, double*, int64_t, int64_t, int64_t, bool);

// The CPU kernel of ops::grouped_linear_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
// impl picks a CUDA implementation: unused here.
void grouped_linear_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y, GroupedGemm) {
    constexpr std::string_view op = "grouped_linear_fwd";
    const int64_t k = x.size(1), e = w.size(0), m = w.size(1);
    const Tensor& o = offsets;  // the entry point's host copy
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 3);
    check_float_arg(y, op, "y", 2);
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(y, x, op, "y", "x");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::grouped_linear_fwd(
                          x.data<scalar_t>(), w.data<scalar_t>(), o.data<int32_t>(), y.data<scalar_t>(), e, k, m));
}
MT_REGISTER_KERNEL(grouped_linear_fwd, cpu, grouped_linear_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::grouped_linear_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void grouped_linear_bwd(const Tensor& x,
                        const Tensor& w,
                        const Tensor& offsets,
                        const Tensor& dy,
                        const Tensor& dx,
                        const Tensor& dw,
                        bool accumulate_dx,
                        GroupedGemm,
                        bool accumulate_dw) {
    constexpr std::string_view op = "grouped_linear_bwd";
    const int64_t k = x.size(1), e = w.size(0), m = w.size(1);
    const Tensor& o = offsets;  // the entry point's host copy
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 3);
    check_float_arg(dy, op, "dy", 2);
    check_dtype_as(w, x, op, "w", "x");
    check_dtype_as(dy, x, op, "dy", "x");
    if (dw.defined()) {
        check_float_arg(dw, op, "dw", 3);
        check_dtype_as(dw, x, op, "dw", "x");
    }
    if (dx.defined()) {
        check_float_arg(dx, op, "dx", 2);
        check_dtype_as(dx, x, op, "dx", "x");
    }
    // accumulate_dx: the reference writes a fresh buffer and adds it (the same sums as the CUDA path's beta = 1)
    const Tensor dx_out = dx.defined() && accumulate_dx ? Tensor::zeros(dx.shape(), dx.dtype()) : dx;
    MT_DISPATCH_FLOAT(x.dtype(), op, {
        cpu::grouped_linear_bwd(x.data<scalar_t>(),
                                w.data<scalar_t>(),
                                o.data<int32_t>(),
                                dy.data<scalar_t>(),
                                data_or_null<scalar_t>(dx_out),
                                data_or_null<scalar_t>(dw),
                                e,
                                k,
                                m,
                                accumulate_dw);
        if (dx.defined() && accumulate_dx) {
            scalar_t* d = dx.data<scalar_t>();
            const scalar_t* s = dx_out.data<scalar_t>();
            for (int64_t i = 0; i < dx.numel(); ++i) d[i] += s[i];
        }
    });
}
MT_REGISTER_KERNEL(grouped_linear_bwd, cpu, grouped_linear_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
