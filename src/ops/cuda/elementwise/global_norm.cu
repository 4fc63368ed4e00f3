// CUDA global L2 norm over a list of tensors, deterministic: two passes in f64 with a fixed partition.
// Dtypes: each tensor f32|bf16|f16 (mixed lists are fine). Pass 1: every tensor is cut into chunks of kChunk elements
// (a partition that depends only on the sizes); one block per chunk sums x^2 in f64 (each thread a fixed stride,
// then a fixed-order block sum) into partial[chunk]. Pass 2: one block sums the partials in a fixed order. One launch
// of each pass serves the whole list; the result is copied back, so the call synchronises.
#include <cmath>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/global_norm.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t{kThreads} * 256;  // elements per block of pass 1
constexpr int kFinalThreads = 1024;

struct NormPart {
    const void* ptr;
    int64_t n;
    int64_t first_chunk;  // index of the tensor's first chunk in the global chunk order
    int kind;             // 0 f32, 1 bf16, 2 f16
};

template <typename T>
__device__ __forceinline__ double sum_squares(const void* ptr, int64_t begin, int64_t end) {
    const T* x = static_cast<const T*>(ptr);
    double sum = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double d = to_f32(x[i]);
        sum += d * d;
    }
    return sum;
}

__global__ void norm_partial_kernel(const NormPart* __restrict__ parts, int count, double* __restrict__ partial) {
    __shared__ double scratch[32];
    const int64_t chunk = blockIdx.x;
    int lo = 0, hi = count - 1;  // the last part whose first_chunk <= chunk
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (parts[mid].first_chunk <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    const NormPart part = parts[lo];
    const int64_t begin = (chunk - part.first_chunk) * kChunk;
    const int64_t end = begin + kChunk < part.n ? begin + kChunk : part.n;
    double sum = part.kind == 1   ? sum_squares<bf16>(part.ptr, begin, end)
                 : part.kind == 2 ? sum_squares<f16>(part.ptr, begin, end)
                                  : sum_squares<float>(part.ptr, begin, end);
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) partial[chunk] = sum;
}

__global__ void norm_final_kernel(const double* __restrict__ partial, int64_t chunks, double* __restrict__ out) {
    __shared__ double scratch[32];
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) *out = sum;
}

}  // namespace

double global_norm(const std::vector<Tensor>& tensors) {
    constexpr std::string_view op = "global_norm";
    std::vector<NormPart> parts;
    int64_t chunks = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        check_cuda_float(tensors[i], op, fmt::format("tensors[{}]", i));
        const int64_t n = tensors[i].numel();
        if (n == 0) continue;
        const DType dt = tensors[i].dtype();
        parts.push_back({tensors[i].raw(), n, chunks, dt == DType::bf16 ? 1 : (dt == DType::f16 ? 2 : 0)});
        chunks += (n + kChunk - 1) / kChunk;
    }
    if (chunks == 0) return 0.0;
    core::NvtxRange range("global_norm");
    // Both buffers are written in full before they are read (the copy; one partial per chunk block, then the total).
    const Tensor parts_dev =
        Tensor::scratch({static_cast<int64_t>(parts.size() * sizeof(NormPart))}, DType::u8, core::Device::cuda);
    MT_CUDA_CHECK(cudaMemcpyAsync(
        parts_dev.raw(), parts.data(), parts.size() * sizeof(NormPart), cudaMemcpyHostToDevice, core::exec_stream()));
    const Tensor partial = Tensor::scratch({chunks + 1}, DType::f64, core::Device::cuda);  // [chunks] + the total
    double* pp = static_cast<double*>(partial.raw());
    norm_partial_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, core::exec_stream()>>>(
        static_cast<const NormPart*>(parts_dev.raw()), static_cast<int>(parts.size()), pp);
    MT_CUDA_CHECK(cudaGetLastError());
    norm_final_kernel<<<1, kFinalThreads, 0, core::exec_stream()>>>(pp, chunks, pp + chunks);
    MT_CUDA_CHECK(cudaGetLastError());
    double total = 0.0;
    MT_CUDA_CHECK(cudaMemcpyAsync(&total, pp + chunks, sizeof(double), cudaMemcpyDeviceToHost, core::exec_stream()));
    MT_CUDA_CHECK(cudaStreamSynchronize(core::exec_stream()));
    return std::sqrt(total);
}
MT_REGISTER_KERNEL(global_norm, cuda, global_norm, ::mt::ops::half_and_float_dtypes);

// The squared norm of one tensor: the norm above, squared (one more rounding, a relative 1e-16).
double global_norm_sq(const Tensor& t) {
    const double norm = global_norm({t});
    return norm * norm;
}
MT_REGISTER_KERNEL(global_norm_sq, cuda, global_norm_sq, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
