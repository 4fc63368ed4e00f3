// CUDA counter-based normal fill (ops/rng_fill.h): out f32|bf16|f16, grid-stride, one Philox block per element in
// double (core/philox.h, the CPU's code), rounded once to out's dtype as the CPU does (double -> f32 -> 16-bit).
#include "core/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/rng_fill.h"

namespace mt::ops::cuda {

namespace {

template <typename T>
__global__ void rng_fill_normal_kernel(
    T* __restrict__ out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const double v = mean + std * core::philox_normal(seed, stream, offset + static_cast<uint64_t>(i));
        out[i] = from_f32<T>(static_cast<float>(v));
    }
}

}  // namespace

void rng_fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std) {
    constexpr std::string_view op = "rng_fill_normal";
    check_cuda_float(out, op, "out");
    const int64_t n = out.numel();
    if (n == 0) return;
    core::NvtxRange range("rng_fill_normal");
    MT_CUDA_DISPATCH(out.dtype(), T, {
        rng_fill_normal_kernel<T><<<grid_for(n, 256), 256, 0, core::exec_stream()>>>(
            static_cast<T*>(out.raw()), n, seed, stream, offset, mean, std);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(rng_fill_normal, cuda, rng_fill_normal, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
