// CUDA row L2 norm (ops/l2norm.h): x, y, dy, dx bf16|f16|f32, one dtype; rinv f32. One warp per row: each lane sums
// a strided slice, then a fixed butterfly, so the result is the same on every run.
#include "ops/cuda/common.cuh"
#include "ops/l2norm.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void l2norm_fwd_kernel(const T* __restrict__ x,
                                  T* __restrict__ y,
                                  float* __restrict__ rinv,
                                  int64_t n,
                                  int64_t c,
                                  float scale,
                                  float eps) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32; r < n;
         r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
        const T* xr = x + r * c;
        float ss = 0.0f;
        for (int64_t i = lane; i < c; i += 32) {
            const float v = to_f32(xr[i]);
            ss += v * v;
        }
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss + eps), f = scale * inv;
        if (lane == 0) rinv[r] = inv;
        for (int64_t i = lane; i < c; i += 32) y[r * c + i] = from_f32<T>(to_f32(xr[i]) * f);
    }
}

// dx = scale rinv (dy - xh (xh . dy)), xh = x rinv
template <typename T>
__global__ void l2norm_bwd_kernel(const T* __restrict__ x,
                                  const float* __restrict__ rinv,
                                  const T* __restrict__ dy,
                                  T* __restrict__ dx,
                                  int64_t n,
                                  int64_t c,
                                  float scale) {
    const int lane = threadIdx.x % 32;
    for (int64_t r = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32; r < n;
         r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
        const T *xr = x + r * c, *dyr = dy + r * c;
        const float inv = rinv[r];
        float dot = 0.0f;
        for (int64_t i = lane; i < c; i += 32) dot += to_f32(xr[i]) * inv * to_f32(dyr[i]);
        dot = warp_sum(dot);
        const float f = scale * inv;
        for (int64_t i = lane; i < c; i += 32)
            dx[r * c + i] = from_f32<T>(f * (to_f32(dyr[i]) - to_f32(xr[i]) * inv * dot));
    }
}

unsigned blocks_for(int64_t n) {
    return grid_for((n + kWarpsPerBlock - 1) / kWarpsPerBlock, 1);
}

}  // namespace

void l2norm_fwd(const Tensor& x, double scale, double eps, const Tensor& y, const Tensor& rinv) {
    constexpr std::string_view op = "l2norm_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(y, x, op, "y", "x");
    check_f32(rinv, op, "rinv");
    const int64_t n = x.size(0), c = x.size(1);
    if (n == 0) return;
    core::NvtxRange range("l2norm_fwd");
    MT_CUDA_DISPATCH(x.dtype(), T, {
        l2norm_fwd_kernel<T>
            <<<blocks_for(n), 32 * kWarpsPerBlock, 0, core::exec_stream()>>>(static_cast<const T*>(x.raw()),
                                                                             static_cast<T*>(y.raw()),
                                                                             rinv.data<float>(),
                                                                             n,
                                                                             c,
                                                                             static_cast<float>(scale),
                                                                             static_cast<float>(eps));
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(l2norm_fwd, cuda, l2norm_fwd, ::mt::ops::half_and_float_dtypes);

void l2norm_bwd(const Tensor& x, const Tensor& rinv, double scale, const Tensor& dy, const Tensor& dx) {
    constexpr std::string_view op = "l2norm_bwd";
    check_cuda_float(x, op, "x");
    check_f32(rinv, op, "rinv");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    const int64_t n = x.size(0), c = x.size(1);
    if (n == 0) return;
    core::NvtxRange range("l2norm_bwd");
    MT_CUDA_DISPATCH(x.dtype(), T, {
        l2norm_bwd_kernel<T>
            <<<blocks_for(n), 32 * kWarpsPerBlock, 0, core::exec_stream()>>>(static_cast<const T*>(x.raw()),
                                                                             rinv.data<float>(),
                                                                             static_cast<const T*>(dy.raw()),
                                                                             static_cast<T*>(dx.raw()),
                                                                             n,
                                                                             c,
                                                                             static_cast<float>(scale));
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(l2norm_bwd, cuda, l2norm_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
