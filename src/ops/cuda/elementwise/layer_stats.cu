// CUDA per-layer statistics (ops/layer_stats.h), deterministic and without a host synchronisation: pass 1 cuts the
// input into chunks of a fixed size (a partition that depends only on the shape); one block per chunk sums its
// slots in f64 (each thread a fixed stride, then a fixed-order block sum) into partial[chunk][slot]. Pass 2: one
// block per slot sums the partials in chunk order and adds the total to out (no float atomics).
// Dtypes: x bf16|f16|f32, alpha f32, out f64; everything stays on the stream.
#include "ops/cuda/common.cuh"
#include "ops/layer_stats.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t{kThreads} * 64;  // elements (moments) per block of pass 1
constexpr int64_t kMixRows = kThreads * 4;          // rows (mix) per block of pass 1

template <typename T>
__global__ void moments_partial_kernel(const T* __restrict__ x, int64_t n, double low, double* __restrict__ partial) {
    __shared__ double scratch[32];
    const int64_t begin = blockIdx.x * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
    double sum = 0.0, sq = 0.0, below = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double v = to_f32(x[i]);
        sum += v;
        sq += v * v;
        below += v <= low ? 1.0 : 0.0;
    }
    sum = block_sum(sum, scratch);
    sq = block_sum(sq, scratch);
    below = block_sum(below, scratch);
    if (threadIdx.x == 0) {
        double* p = partial + 3 * blockIdx.x;
        p[0] = sum, p[1] = sq, p[2] = below;
    }
}

// Per block kMixRows rows of alpha [rows, m]: the column sums and the entropy sum, m + 1 slots.
__global__ void mix_partial_kernel(const float* __restrict__ alpha, int64_t rows, int m, double* __restrict__ partial) {
    __shared__ double scratch[32];
    double acc[kLayerStatsMaxSources + 1];
#pragma unroll
    for (int j = 0; j <= kLayerStatsMaxSources; ++j) acc[j] = 0.0;
    const int64_t begin = blockIdx.x * kMixRows, end = begin + kMixRows < rows ? begin + kMixRows : rows;
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) {
        double entropy = 0.0;
#pragma unroll
        for (int j = 0; j < kLayerStatsMaxSources; ++j) {
            if (j >= m) break;
            const double a = alpha[r * m + j];
            acc[j] += a;
            if (a > 0.0) entropy -= a * log(a);
        }
        acc[kLayerStatsMaxSources] += entropy;
    }
    for (int j = 0; j <= m; ++j) {
        const double total = block_sum(j < m ? acc[j] : acc[kLayerStatsMaxSources], scratch);
        if (threadIdx.x == 0) partial[blockIdx.x * (m + 1) + j] = total;
    }
}

// Block s: out[1 + s] += sum over chunks of partial[chunk][s]; block 0 also adds the count.
__global__ void final_kernel(
    const double* __restrict__ partial, int64_t chunks, int slots, double count, double* __restrict__ out) {
    __shared__ double scratch[32];
    const int s = blockIdx.x;
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) sum += partial[c * slots + s];
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        out[1 + s] += sum;
        if (s == 0) out[0] += count;
    }
}

void finish(const Tensor& partial, int64_t chunks, int slots, double count, const Tensor& out) {
    final_kernel<<<static_cast<unsigned>(slots), kThreads, 0, core::exec_stream()>>>(
        static_cast<const double*>(partial.raw()), chunks, slots, count, out.data<double>());
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void layer_stats_moments(const Tensor& x, double low, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_moments";
    check_cuda_float(x, op, "x");
    const int64_t n = x.numel();
    if (n == 0) return;
    core::NvtxRange range("layer_stats_moments");
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    // Written in full by pass 1 before pass 2 reads it.
    const Tensor partial = Tensor::scratch({3 * chunks}, DType::f64, core::Device::cuda);
    MT_CUDA_DISPATCH(x.dtype(), T, {
        moments_partial_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0, core::exec_stream()>>>(
            static_cast<const T*>(x.raw()), n, low, static_cast<double*>(partial.raw()));
    });
    MT_CUDA_CHECK(cudaGetLastError());
    finish(partial, chunks, 3, static_cast<double>(n), out);
}
MT_REGISTER_KERNEL(layer_stats_moments, cuda, layer_stats_moments, ::mt::ops::half_and_float_dtypes);

void layer_stats_mix(const Tensor& alpha, const Tensor& out) {
    constexpr std::string_view op = "layer_stats_mix";
    check_f32(alpha, op, "alpha");
    const int64_t rows = alpha.size(0), m = alpha.size(1);
    if (rows == 0) return;
    core::NvtxRange range("layer_stats_mix");
    const int64_t chunks = (rows + kMixRows - 1) / kMixRows;
    const Tensor partial = Tensor::scratch({(m + 1) * chunks}, DType::f64, core::Device::cuda);
    mix_partial_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, core::exec_stream()>>>(
        alpha.data<float>(), rows, static_cast<int>(m), static_cast<double*>(partial.raw()));
    MT_CUDA_CHECK(cudaGetLastError());
    finish(partial, chunks, static_cast<int>(m + 1), static_cast<double>(rows), out);
}
MT_REGISTER_KERNEL(layer_stats_mix, cuda, layer_stats_mix, ::mt::ops::any_dtype);

}  // namespace mt::ops::cuda
