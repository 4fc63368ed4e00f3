// CUDA global L2 norm over a list of tensors, and the sums of squares of several groups of them, deterministic: two
// passes in f64 with a fixed partition. Dtypes: each tensor f32|bf16|f16 (mixed lists are fine).
// Pass 1: every tensor is cut into chunks of kChunk elements (a partition that depends only on the sizes); one block
// per chunk sums x^2 in f64 (16-byte loads where the tensor is 16-byte aligned, each thread a fixed stride, then a
// fixed-order block sum) into partial[chunk]. Pass 2: one block per group sums its chunks' partials, thread t taking
// the group's chunks t, t + blockDim, ... in list order, then a fixed-order block sum. One launch of each pass serves
// the whole list and every group; the results are copied back, so the call synchronises once (the metrics steps
// used to synchronise once per layer group).
#include <cmath>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/global_norm.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t{kThreads} * 256;  // elements per block of pass 1 (a multiple of 8)
constexpr int kFinalThreads = 1024;

struct NormPart {
    const void* ptr;
    int64_t n;
    int64_t first_chunk;  // index of the tensor's first chunk in the global chunk order
    int64_t group_first;  // chunks of the same group before this tensor's (its position in the group's order)
    int group;
    int kind;  // 0 f32, 1 bf16, 2 f16
    bool vec;  // 16-byte aligned: chunks read 16 bytes at a time
};

template <typename T>
__device__ __forceinline__ double sum_squares(const void* ptr, int64_t begin, int64_t end, bool vec) {
    const T* x = static_cast<const T*>(ptr);
    double sum = 0.0;
    int64_t i = begin;
    if (vec) {
        // kChunk is a multiple of 8, so a chunk of an aligned tensor starts aligned.
        constexpr int kVec = 16 / sizeof(T);
        const int64_t vec_end = begin + (end - begin) / kVec * kVec;
        for (int64_t k = begin + threadIdx.x * kVec; k < vec_end; k += static_cast<int64_t>(blockDim.x) * kVec) {
            float v[8];
            if constexpr (kVec == 8) {
                load_vec<8>(x + k, v);
            } else {
                const float4 a = *reinterpret_cast<const float4*>(x + k);
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            }
#pragma unroll
            for (int e = 0; e < kVec; ++e) sum += static_cast<double>(v[e]) * v[e];
        }
        i = vec_end;
    }
    for (int64_t k = i + threadIdx.x; k < end; k += blockDim.x) {
        const double d = to_f32(x[k]);
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
    double sum = part.kind == 1   ? sum_squares<bf16>(part.ptr, begin, end, part.vec)
                 : part.kind == 2 ? sum_squares<f16>(part.ptr, begin, end, part.vec)
                                  : sum_squares<float>(part.ptr, begin, end, part.vec);
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) partial[chunk] = sum;
}

// Block g: the partials of group g's chunks, in the group's order (its tensors in list order).
__global__ void norm_group_kernel(const NormPart* __restrict__ parts,
                                  int count,
                                  const double* __restrict__ partial,
                                  double* __restrict__ out) {
    __shared__ double scratch[32];
    const int g = blockIdx.x;
    const int64_t threads = blockDim.x;
    double sum = 0.0;
    for (int p = 0; p < count; ++p) {
        const NormPart part = parts[p];
        if (part.group != g) continue;
        const int64_t chunks = (part.n + kChunk - 1) / kChunk;
        // This thread's positions k = t (mod threads) of the group's order, inside this tensor's stretch.
        int64_t j = (threadIdx.x - part.group_first % threads + threads) % threads;
        for (; j < chunks; j += threads) sum += partial[part.first_chunk + j];
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) out[g] = sum;
}

std::vector<double> norms_sq(const std::vector<Tensor>& tensors,
                             const std::vector<int>& group,
                             int groups,
                             std::string_view op) {
    std::vector<NormPart> parts;
    std::vector<int64_t> group_chunks(static_cast<size_t>(groups), 0);
    int64_t chunks = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        check_cuda_float(tensors[i], op, fmt::format("tensors[{}]", i));
        const int64_t n = tensors[i].numel();
        if (n == 0) continue;
        const DType dt = tensors[i].dtype();
        const int64_t nc = (n + kChunk - 1) / kChunk;
        int64_t& before = group_chunks[static_cast<size_t>(group[i])];
        parts.push_back({tensors[i].raw(),
                         n,
                         chunks,
                         before,
                         group[i],
                         dt == DType::bf16 ? 1 : (dt == DType::f16 ? 2 : 0),
                         reinterpret_cast<uintptr_t>(tensors[i].raw()) % 16 == 0});
        before += nc;
        chunks += nc;
    }
    std::vector<double> out(static_cast<size_t>(groups), 0.0);
    if (chunks == 0 || groups == 0) return out;
    core::NvtxRange range("global_norm");
    // Every buffer is written in full before it is read (the copy; one partial per chunk block, one sum per group).
    const Tensor parts_dev =
        Tensor::scratch({static_cast<int64_t>(parts.size() * sizeof(NormPart))}, DType::u8, core::Device::cuda);
    MT_CUDA_CHECK(cudaMemcpyAsync(
        parts_dev.raw(), parts.data(), parts.size() * sizeof(NormPart), cudaMemcpyHostToDevice, core::exec_stream()));
    const Tensor partial = Tensor::scratch({chunks + groups}, DType::f64, core::Device::cuda);  // + the group sums
    double* pp = static_cast<double*>(partial.raw());
    const auto* pd = static_cast<const NormPart*>(parts_dev.raw());
    const int count = static_cast<int>(parts.size());
    norm_partial_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, core::exec_stream()>>>(pd, count, pp);
    MT_CUDA_CHECK(cudaGetLastError());
    norm_group_kernel<<<static_cast<unsigned>(groups), kFinalThreads, 0, core::exec_stream()>>>(
        pd, count, pp, pp + chunks);
    MT_CUDA_CHECK(cudaGetLastError());
    MT_CUDA_CHECK(cudaMemcpyAsync(
        out.data(), pp + chunks, out.size() * sizeof(double), cudaMemcpyDeviceToHost, core::exec_stream()));
    MT_CUDA_CHECK(cudaStreamSynchronize(core::exec_stream()));
    return out;
}

}  // namespace

double global_norm(const std::vector<Tensor>& tensors) {
    return std::sqrt(norms_sq(tensors, std::vector<int>(tensors.size(), 0), 1, "global_norm")[0]);
}
MT_REGISTER_KERNEL(global_norm, cuda, global_norm, ::mt::ops::half_and_float_dtypes);

// The sum of squares of one tensor (the norm above before its root).
double global_norm_sq(const Tensor& t) {
    return norms_sq({t}, {0}, 1, "global_norm_sq")[0];
}
MT_REGISTER_KERNEL(global_norm_sq, cuda, global_norm_sq, ::mt::ops::half_and_float_dtypes);

std::vector<double> global_norms_sq(const std::vector<Tensor>& tensors, const std::vector<int>& group, int groups) {
    return norms_sq(tensors, group, groups, "global_norms_sq");
}
MT_REGISTER_KERNEL(global_norms_sq, cuda, global_norms_sq, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
