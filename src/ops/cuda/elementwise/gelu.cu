// CUDA exact GELU, elementwise over flat buffers (deterministic).
// Dtypes: x, y, dy, dx bf16|f16|f32, all the dtype of x; the math runs in f32 (erff, expf). Each thread reads its
// elements before it writes them, so y may alias x and dx may alias dy or x (no __restrict__ on those pointers).
#include "ops/cuda/common.cuh"
#include "ops/gelu.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kInvSqrt2 = 0.70710678118654752440f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)

// y = 0.5 x (1 + erf(x / sqrt(2)))
template <int VEC, typename T>
__global__ void gelu_fwd_kernel(const T* x, T* y, int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float v[VEC];
        load_vec<VEC>(x + k, v);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = 0.5f * v[i] * (1.0f + erff(v[i] * kInvSqrt2));
        store_vec<VEC>(y + k, v);
    }
}

// dx = dy (Phi(x) + x phi(x))
template <int VEC, typename T>
__global__ void gelu_bwd_kernel(const T* x, const T* dy, T* dx, int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float v[VEC], d[VEC];
        load_vec<VEC>(x + k, v);
        load_vec<VEC>(dy + k, d);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            const float cdf = 0.5f * (1.0f + erff(v[i] * kInvSqrt2));
            const float pdf = expf(-0.5f * v[i] * v[i]) * kInvSqrt2Pi;
            d[i] = d[i] * (cdf + v[i] * pdf);
        }
        store_vec<VEC>(dx + k, d);
    }
}

}  // namespace

void gelu_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "gelu_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(y, x, op, "y", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("gelu_fwd");
    const bool vec = vec_ok(n, {&x, &y});
    MT_CUDA_DISPATCH(x.dtype(), T, {
        const T* xp = static_cast<const T*>(x.raw());
        T* yp = static_cast<T*>(y.raw());
        if (vec)
            gelu_fwd_kernel<8, T><<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(xp, yp, n);
        else
            gelu_fwd_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(xp, yp, n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(gelu_fwd, cuda, gelu_fwd, ::mt::ops::half_and_float_dtypes);

void gelu_bwd(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "gelu_bwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("gelu_bwd");
    const bool vec = vec_ok(n, {&x, &dy, &dx});
    MT_CUDA_DISPATCH(x.dtype(), T, {
        const T* xp = static_cast<const T*>(x.raw());
        const T* dyp = static_cast<const T*>(dy.raw());
        T* dxp = static_cast<T*>(dx.raw());
        if (vec)
            gelu_bwd_kernel<8, T><<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(xp, dyp, dxp, n);
        else
            gelu_bwd_kernel<1, T><<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(xp, dyp, dxp, n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(gelu_bwd, cuda, gelu_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
