// CPU reference of the sigmoid gate (ops/sigmoid_gate.h), over fixed blocks of elements.
#include "ops/sigmoid_gate.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {
namespace {

constexpr int64_t kBlock = 4096;

template <typename T>
T sigmoid(T z) {
    return z >= 0 ? T(1) / (T(1) + std::exp(-z)) : std::exp(z) / (T(1) + std::exp(z));
}

}  // namespace

template <typename T>
void sigmoid_gate_fwd(const T* x, const T* z, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) out[i] = x[i] * sigmoid(z[i]);
    }
}

template <typename T>
void sigmoid_gate_bwd(const T* x, const T* z, const T* dout, T* dx, T* dz, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
            const T s = sigmoid(z[i]);
            dx[i] = dout[i] * s;
            dz[i] = dout[i] * x[i] * s * (T(1) - s);
        }
    }
}

template void sigmoid_gate_fwd<float>(const float*, const float*, float*, int64_t);
template void sigmoid_gate_fwd<double>(const double*, const double*, double*, int64_t);
template void sigmoid_gate_bwd<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void sigmoid_gate_bwd<double>(const double*, const double*, const double*, double*, double*, int64_t);

namespace {

void check_like(const Tensor& t, const Tensor& x, std::string_view op, const char* name) {
    check_float_arg(t, op, name, x.ndim());
    check_shape(t, x.shape(), op, name);
    check_dtype_as(t, x, op, name, "x");
}

}  // namespace

// The CPU kernel of ops::sigmoid_gate_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out) {
    constexpr std::string_view op = "sigmoid_gate_fwd";
    check_float_arg(x, op, "x", x.ndim());
    check_like(z, x, op, "z");
    check_like(out, x, op, "out");
    MT_DISPATCH_FLOAT(
        x.dtype(), op, cpu::sigmoid_gate_fwd(x.data<scalar_t>(), z.data<scalar_t>(), out.data<scalar_t>(), x.numel()));
}
MT_REGISTER_KERNEL(sigmoid_gate_fwd, cpu, sigmoid_gate_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::sigmoid_gate_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz) {
    constexpr std::string_view op = "sigmoid_gate_bwd";
    check_float_arg(x, op, "x", x.ndim());
    check_like(z, x, op, "z");
    check_like(dout, x, op, "dout");
    check_like(dx, x, op, "dx");
    check_like(dz, x, op, "dz");
    MT_DISPATCH_FLOAT(x.dtype(),
                      op,
                      cpu::sigmoid_gate_bwd(x.data<scalar_t>(),
                                            z.data<scalar_t>(),
                                            dout.data<scalar_t>(),
                                            dx.data<scalar_t>(),
                                            dz.data<scalar_t>(),
                                            x.numel()));
}
MT_REGISTER_KERNEL(sigmoid_gate_bwd, cpu, sigmoid_gate_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
