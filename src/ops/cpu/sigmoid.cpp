// CPU reference of the elementwise sigmoid (ops/sigmoid.h), over fixed blocks of elements.
#include "ops/sigmoid.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {
namespace {
constexpr int64_t kBlock = 4096;
}

template <typename T>
void sigmoid_fwd(const T* x, T* y, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i)
            y[i] = x[i] >= 0 ? T(1) / (T(1) + std::exp(-x[i])) : std::exp(x[i]) / (T(1) + std::exp(x[i]));
    }
}

template <typename T>
void sigmoid_bwd(const T* y, const T* dy, T* dx, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
    }
}

template void sigmoid_fwd<float>(const float*, float*, int64_t);
template void sigmoid_fwd<double>(const double*, double*, int64_t);
template void sigmoid_bwd<float>(const float*, const float*, float*, int64_t);
template void sigmoid_bwd<double>(const double*, const double*, double*, int64_t);

namespace {

void check_like(const Tensor& t, const Tensor& ref, std::string_view op, const char* name, const char* ref_name) {
    check_float_arg(t, op, name, ref.ndim());
    check_shape(t, ref.shape(), op, name);
    check_dtype_as(t, ref, op, name, ref_name);
}

}  // namespace

// The CPU kernel of ops::sigmoid_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void sigmoid_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "sigmoid_fwd";
    check_float_arg(x, op, "x", x.ndim());
    check_like(y, x, op, "y", "x");
    MT_DISPATCH_FLOAT(x.dtype(), op, cpu::sigmoid_fwd(x.data<scalar_t>(), y.data<scalar_t>(), x.numel()));
}
MT_REGISTER_KERNEL(sigmoid_fwd, cpu, sigmoid_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::sigmoid_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "sigmoid_bwd";
    check_float_arg(y, op, "y", y.ndim());
    check_like(dy, y, op, "dy", "y");
    check_like(dx, y, op, "dx", "y");
    MT_DISPATCH_FLOAT(
        y.dtype(), op, cpu::sigmoid_bwd(y.data<scalar_t>(), dy.data<scalar_t>(), dx.data<scalar_t>(), y.numel()));
}
MT_REGISTER_KERNEL(sigmoid_bwd, cpu, sigmoid_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
