// CUDA elementwise sigmoid (ops/sigmoid.h): x, y, dy, dx bf16|f16|f32, one dtype; f32 math, grid-stride loops.
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/sigmoid.h"

namespace mt::ops::cuda {

namespace {

template <typename T>
__global__ void sigmoid_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        y[i] = from_f32<T>(sigmoid_f32(to_f32(x[i])));
}

template <typename T>
__global__ void sigmoid_bwd_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float yv = to_f32(y[i]);
        dx[i] = from_f32<T>(to_f32(dy[i]) * yv * (1.0f - yv));
    }
}

}  // namespace

void sigmoid_fwd(const Tensor& x, const Tensor& y) {
    constexpr std::string_view op = "sigmoid_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(y, x, op, "y", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("sigmoid_fwd");
    MT_CUDA_DISPATCH(x.dtype(), T, {
        sigmoid_fwd_kernel<T><<<grid_for(n, 256), 256, 0, core::exec_stream()>>>(
            static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()), n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(sigmoid_fwd, cuda, sigmoid_fwd, ::mt::ops::half_and_float_dtypes);

void sigmoid_bwd(const Tensor& y, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "sigmoid_bwd";
    check_cuda_float(y, op, "y");
    check_dtype_as(dy, y, op, "dy", "y");
    check_dtype_as(dx, y, op, "dx", "y");
    const int64_t n = y.numel();
    if (n == 0) return;
    core::NvtxRange range("sigmoid_bwd");
    MT_CUDA_DISPATCH(y.dtype(), T, {
        sigmoid_bwd_kernel<T><<<grid_for(n, 256), 256, 0, core::exec_stream()>>>(
            static_cast<const T*>(y.raw()), static_cast<const T*>(dy.raw()), static_cast<T*>(dx.raw()), n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(sigmoid_bwd, cuda, sigmoid_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
