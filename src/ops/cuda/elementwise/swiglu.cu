// CUDA SwiGLU gate, elementwise over flat buffers (deterministic).
// Dtypes: gate, up, out, dout, dgate, dup bf16|f16|f32, all the dtype of gate; the math runs in f32.
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/swiglu.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// out = g sigmoid(g) u
template <int VEC, typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ gate,
                                  const T* __restrict__ up,
                                  T* __restrict__ out,
                                  int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float g[VEC], u[VEC], o[VEC];
        load_vec<VEC>(gate + k, g);
        load_vec<VEC>(up + k, u);
#pragma unroll
        for (int v = 0; v < VEC; ++v) o[v] = g[v] / (1.0f + expf(-g[v])) * u[v];
        store_vec<VEC>(out + k, o);
    }
}

// dgate = dout u sig (1 + g (1 - sig)),  dup = dout g sig
template <int VEC, typename T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ gate,
                                  const T* __restrict__ up,
                                  const T* __restrict__ dout,
                                  T* __restrict__ dgate,
                                  T* __restrict__ dup,
                                  int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
        load_vec<VEC>(gate + k, g);
        load_vec<VEC>(up + k, u);
        load_vec<VEC>(dout + k, d);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const float sig = 1.0f / (1.0f + expf(-g[v]));
            dg[v] = d[v] * u[v] * sig * (1.0f + g[v] * (1.0f - sig));
            du[v] = d[v] * g[v] * sig;
        }
        store_vec<VEC>(dgate + k, dg);
        store_vec<VEC>(dup + k, du);
    }
}

}  // namespace

void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
    constexpr std::string_view op = "swiglu_fwd";
    check_cuda_float(gate, op, "gate");
    check_dtype_as(up, gate, op, "up", "gate");
    check_dtype_as(out, gate, op, "out", "gate");
    const int64_t n = gate.numel();
    if (n == 0) return;
    core::NvtxRange range("swiglu_fwd");
    const bool vec = vec_ok(n, {&gate, &up, &out});
    MT_CUDA_DISPATCH(gate.dtype(), T, {
        const T* g = static_cast<const T*>(gate.raw());
        const T* u = static_cast<const T*>(up.raw());
        T* o = static_cast<T*>(out.raw());
        if (vec)
            swiglu_fwd_kernel<8, T><<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(g, u, o, n);
        else
            swiglu_fwd_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(g, u, o, n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(swiglu_fwd, cuda, swiglu_fwd, ::mt::ops::half_and_float_dtypes);

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate, const Tensor& dup) {
    constexpr std::string_view op = "swiglu_bwd";
    check_cuda_float(gate, op, "gate");
    check_dtype_as(up, gate, op, "up", "gate");
    check_dtype_as(dout, gate, op, "dout", "gate");
    check_dtype_as(dgate, gate, op, "dgate", "gate");
    check_dtype_as(dup, gate, op, "dup", "gate");
    const int64_t n = gate.numel();
    if (n == 0) return;
    core::NvtxRange range("swiglu_bwd");
    const bool vec = vec_ok(n, {&gate, &up, &dout, &dgate, &dup});
    MT_CUDA_DISPATCH(gate.dtype(), T, {
        const T* g = static_cast<const T*>(gate.raw());
        const T* u = static_cast<const T*>(up.raw());
        const T* d = static_cast<const T*>(dout.raw());
        T* dg = static_cast<T*>(dgate.raw());
        T* du = static_cast<T*>(dup.raw());
        if (vec)
            swiglu_bwd_kernel<8, T>
                <<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(g, u, d, dg, du, n);
        else
            swiglu_bwd_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(g, u, d, dg, du, n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(swiglu_bwd, cuda, swiglu_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
