// CUDA sigmoid gate (ops/sigmoid_gate.h): out = x sigmoid(z); x, z, out, dout, dx, dz bf16|f16|f32, one dtype; f32
// math, grid-stride loops.
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/sigmoid_gate.h"

namespace mt::ops::cuda {

namespace {

template <typename T>
__global__ void sigmoid_gate_fwd_kernel(const T* __restrict__ x,
                                        const T* __restrict__ z,
                                        T* __restrict__ out,
                                        int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        out[i] = from_f32<T>(to_f32(x[i]) * sigmoid_f32(to_f32(z[i])));
}

template <typename T>
__global__ void sigmoid_gate_bwd_kernel(const T* __restrict__ x,
                                        const T* __restrict__ z,
                                        const T* __restrict__ dout,
                                        T* __restrict__ dx,
                                        T* __restrict__ dz,
                                        int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float s = sigmoid_f32(to_f32(z[i])), d = to_f32(dout[i]);
        dx[i] = from_f32<T>(d * s);
        dz[i] = from_f32<T>(d * to_f32(x[i]) * s * (1.0f - s));
    }
}

}  // namespace

void sigmoid_gate_fwd(const Tensor& x, const Tensor& z, const Tensor& out) {
    constexpr std::string_view op = "sigmoid_gate_fwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(z, x, op, "z", "x");
    check_dtype_as(out, x, op, "out", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("sigmoid_gate_fwd");
    MT_CUDA_DISPATCH(x.dtype(), T, {
        sigmoid_gate_fwd_kernel<T><<<grid_for(n, 256), 256, 0, core::exec_stream()>>>(
            static_cast<const T*>(x.raw()), static_cast<const T*>(z.raw()), static_cast<T*>(out.raw()), n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(sigmoid_gate_fwd, cuda, sigmoid_gate_fwd, ::mt::ops::half_and_float_dtypes);

void sigmoid_gate_bwd(const Tensor& x, const Tensor& z, const Tensor& dout, const Tensor& dx, const Tensor& dz) {
    constexpr std::string_view op = "sigmoid_gate_bwd";
    check_cuda_float(x, op, "x");
    check_dtype_as(z, x, op, "z", "x");
    check_dtype_as(dout, x, op, "dout", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_dtype_as(dz, x, op, "dz", "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("sigmoid_gate_bwd");
    MT_CUDA_DISPATCH(x.dtype(), T, {
        sigmoid_gate_bwd_kernel<T><<<grid_for(n, 256), 256, 0, core::exec_stream()>>>(static_cast<const T*>(x.raw()),
                                                                                      static_cast<const T*>(z.raw()),
                                                                                      static_cast<const T*>(dout.raw()),
                                                                                      static_cast<T*>(dx.raw()),
                                                                                      static_cast<T*>(dz.raw()),
                                                                                      n);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(sigmoid_gate_bwd, cuda, sigmoid_gate_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
