// CPU reference of the SwiGLU gate, elementwise over flat buffers; exp(-gate) is computed a slice at a time into a
// small buffer with the vectorized exp (see vec_math.h).
#include "ops/swiglu.h"

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

// out = g * sigmoid(g) * u, sigmoid(g) = 1 / (1 + exp(-g))
template <typename T>
void swiglu_fwd(const T* gate, const T* up, T* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-g) of one slice
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            const T* g = gate + s0;  // [len]
            exp_affine(g, e, len, T(-1), T(0));
            for (int64_t i = 0; i < len; ++i) out[s0 + i] = g[i] / (T(1) + e[i]) * up[s0 + i];
        }
    }
}

// dgate = dout * u * sigmoid(g) * (1 + g (1 - sigmoid(g))),  dup = dout * g * sigmoid(g)
template <typename T>
void swiglu_bwd(const T* gate, const T* up, const T* dout, T* dgate, T* dup, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T e[kSlice];  // exp(-g) of one slice
        for (int64_t s0 = blk * kBlock; s0 < std::min(n, (blk + 1) * kBlock); s0 += kSlice) {
            const int64_t len = std::min(kSlice, n - s0);
            const T* g = gate + s0;  // [len]
            exp_affine(g, e, len, T(-1), T(0));
            for (int64_t i = 0; i < len; ++i) {
                const T sig = T(1) / (T(1) + e[i]), d = dout[s0 + i];
                dgate[s0 + i] = d * up[s0 + i] * sig * (T(1) + g[i] * (T(1) - sig));
                dup[s0 + i] = d * g[i] * sig;
            }
        }
    }
}

template void swiglu_fwd<float>(const float*, const float*, float*, int64_t);
template void swiglu_fwd<double>(const double*, const double*, double*, int64_t);
template void swiglu_bwd<float>(const float*, const float*, const float*, float*, float*, int64_t);
template void swiglu_bwd<double>(const double*, const double*, const double*, double*, double*, int64_t);

// The CPU kernel of ops::swiglu_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
    constexpr std::string_view op = "swiglu_fwd";
    check_float_arg(gate, op, "gate", 2);
    check_float_arg(up, op, "up", 2);
    check_float_arg(out, op, "out", 2);
    check_dtype_as(up, gate, op, "up", "gate");
    check_dtype_as(out, gate, op, "out", "gate");
    MT_DISPATCH_FLOAT(gate.dtype(),
                      op,
                      cpu::swiglu_fwd(gate.data<scalar_t>(), up.data<scalar_t>(), out.data<scalar_t>(), gate.numel()));
}
MT_REGISTER_KERNEL(swiglu_fwd, cpu, swiglu_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::swiglu_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate, const Tensor& dup) {
    constexpr std::string_view op = "swiglu_bwd";
    check_float_arg(gate, op, "gate", 2);
    check_float_arg(up, op, "up", 2);
    check_float_arg(dout, op, "dout", 2);
    check_float_arg(dgate, op, "dgate", 2);
    check_float_arg(dup, op, "dup", 2);
    check_dtype_as(up, gate, op, "up", "gate");
    check_dtype_as(dout, gate, op, "dout", "gate");
    check_dtype_as(dgate, gate, op, "dgate", "gate");
    check_dtype_as(dup, gate, op, "dup", "gate");
    MT_DISPATCH_FLOAT(gate.dtype(),
                      op,
                      cpu::swiglu_bwd(gate.data<scalar_t>(),
                                      up.data<scalar_t>(),
                                      dout.data<scalar_t>(),
                                      dgate.data<scalar_t>(),
                                      dup.data<scalar_t>(),
                                      gate.numel()));
}
MT_REGISTER_KERNEL(swiglu_bwd, cpu, swiglu_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
