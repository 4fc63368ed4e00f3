// CPU reference of the sigmoid gate (ops/sigmoid_gate.h), over fixed blocks of elements; exp(-z) a slice at a time
// into a small buffer with the vectorized exp (vec_math.h), as swiglu.cpp does.
#include "ops/sigmoid_gate.h"

#include <algorithm>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"
#include "ops/registry.h"

namespace mt::ops::cpu {
namespace {

constexpr int64_t kBlock = 4096;  // elements per parallel task
constexpr int64_t kSlice = 256;   // elements per exp buffer

}  // namespace

template <typename T>
void sigmoid_gate_fwd(const T* x, const T* z, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-z) of one slice; sigmoid(z) = 1 / (1 + exp(-z)) (the exp is clamped: no inf)
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            exp_affine(z + s0, e, len, T(-1), T(0));
            for (int64_t i = 0; i < len; ++i) out[s0 + i] = x[s0 + i] / (T(1) + e[i]);
        }
    }
}

template <typename T>
void sigmoid_gate_bwd(const T* x, const T* z, const T* dout, T* dx, T* dz, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-z) of one slice
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            exp_affine(z + s0, e, len, T(-1), T(0));
            for (int64_t j = 0; j < len; ++j) {
                const int64_t i = s0 + j;
                const T s = T(1) / (T(1) + e[j]);
                dx[i] = dout[i] * s;
                dz[i] = dout[i] * x[i] * s * (T(1) - s);
            }
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
