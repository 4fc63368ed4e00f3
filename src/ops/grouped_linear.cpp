// Entry points of the grouped linear op: argument checks (offsets monotone and covering the rows), then the CPU
// reference (no CUDA path yet: cuda tensors fail with "not implemented on cuda yet").
#include "ops/grouped_linear.h"

#include "ops/cpu/checks.h"

namespace mt::ops {

namespace cpu {
// The kernels of src/ops/cpu/grouped_linear.cpp (shapes as in ops/grouped_linear.h; dx may be null).
template <typename T>
void grouped_linear_fwd(const T* x, const T* w, const int32_t* offsets, T* y, int64_t e, int64_t k, int64_t m);
template <typename T>
void grouped_linear_bwd(
    const T* x, const T* w, const int32_t* offsets, const T* dy, T* dx, T* dw, int64_t e, int64_t k, int64_t m);
}  // namespace cpu

namespace {

void check_offsets(const Tensor& offsets, int64_t e, int64_t rows, std::string_view op) {
    MT_CHECK(offsets.defined(), "{}: offsets is undefined", op);
    MT_CHECK(offsets.device() == core::Device::cpu,
             "{}: offsets is a {} tensor; {} is not implemented on cuda yet",
             op,
             core::device_name(offsets.device()),
             op);
    cpu::check_i32_arg(offsets, op, "offsets", 1);
    check_shape(offsets, {e + 1}, op, "offsets");
    const int32_t* o = offsets.data<int32_t>();
    MT_CHECK(o[0] == 0 && o[e] == rows,
             "{}: offsets run from {} to {}, expected 0 to {} (the rows of x)",
             op,
             o[0],
             o[e],
             rows);
    for (int64_t j = 0; j < e; ++j)
        MT_CHECK(o[j] <= o[j + 1], "{}: offsets decrease at expert {} ({} > {})", op, j, o[j], o[j + 1]);
}

template <typename T>
T* data_or_null(const Tensor& t) {
    return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void grouped_linear_fwd(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y) {
    constexpr std::string_view op = "grouped_linear_fwd";
    check_same_device(op, {{"x", x}, {"w", w}, {"offsets", offsets}, {"y", y}});
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 3);
    check_float_arg(y, op, "y", 2);
    cpu::check_dtype_as(w, x, op, "w", "x");
    cpu::check_dtype_as(y, x, op, "y", "x");
    const int64_t rows = x.size(0), k = x.size(1), e = w.size(0), m = w.size(1);
    check_shape(w, {e, m, k}, op, "w");
    check_shape(y, {rows, m}, op, "y");
    check_offsets(offsets, e, rows, op);
    MT_DISPATCH_FLOAT(
        x.dtype(),
        op,
        cpu::grouped_linear_fwd(
            x.data<scalar_t>(), w.data<scalar_t>(), offsets.data<int32_t>(), y.data<scalar_t>(), e, k, m));
}

void grouped_linear_bwd(
    const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& dy, const Tensor& dx, const Tensor& dw) {
    constexpr std::string_view op = "grouped_linear_bwd";
    check_same_device(op, {{"x", x}, {"w", w}, {"offsets", offsets}, {"dy", dy}, {"dx", dx}, {"dw", dw}});
    check_float_arg(x, op, "x", 2);
    check_float_arg(w, op, "w", 3);
    check_float_arg(dy, op, "dy", 2);
    check_float_arg(dw, op, "dw", 3);
    cpu::check_dtype_as(w, x, op, "w", "x");
    cpu::check_dtype_as(dy, x, op, "dy", "x");
    cpu::check_dtype_as(dw, x, op, "dw", "x");
    const int64_t rows = x.size(0), k = x.size(1), e = w.size(0), m = w.size(1);
    check_shape(w, {e, m, k}, op, "w");
    check_shape(dy, {rows, m}, op, "dy");
    check_shape(dw, {e, m, k}, op, "dw");
    if (dx.defined()) {
        check_float_arg(dx, op, "dx", 2);
        cpu::check_dtype_as(dx, x, op, "dx", "x");
        check_shape(dx, {rows, k}, op, "dx");
    }
    check_offsets(offsets, e, rows, op);
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::grouped_linear_bwd(x.data<scalar_t>(),
                                              w.data<scalar_t>(),
                                              offsets.data<int32_t>(),
                                              dy.data<scalar_t>(),
                                              data_or_null<scalar_t>(dx),
                                              dw.data<scalar_t>(),
                                              e,
                                              k,
                                              m));
}

}  // namespace mt::ops
