// The CUDA kernels of ops/moe_balance.h, so that the [N, E] routing scores never go to the host: per-expert loads,
// QB's histogram, the token entropy sum and the aux loss. Counts are integer
// atomics (exact in any order: shared-memory counts per block, then one global add per block and bin); float sums
// run in a fixed order. Dtypes: scores, cutoff, dscores bf16|f16|f32 (one dtype); indices i32; counts, hist i64; acc
// f64. Token groups (group i32 [N], or null): only the tokens whose group equals `keep` count.
#include <cmath>

#include "core/backend.h"
#include "ops/cuda/moe/moe_common.cuh"
#include "ops/moe_balance.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kTokensPerBlock = 2048;
constexpr int kHistSharedBytes = 32 * 1024;

using u64 = unsigned long long;

__global__ void expert_counts_kernel(const int32_t* __restrict__ idx,
                                     const int32_t* __restrict__ group,
                                     int32_t keep,
                                     u64* counts,
                                     int64_t slots,
                                     int k,
                                     int e) {
    extern __shared__ unsigned local_counts[];  // [E]
    for (int j = threadIdx.x; j < e; j += blockDim.x) local_counts[j] = 0;
    __syncthreads();
    for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < slots;
         s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int32_t j = idx[s];
        if (group && group[s / k] != keep) continue;
        if (j >= 0 && j < e) atomicAdd(&local_counts[j], 1u);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < e; j += blockDim.x)
        if (local_counts[j]) atomicAdd(&counts[j], static_cast<u64>(local_counts[j]));
}

// Block (g, c): experts [g * eb, g * eb + eb) over tokens [c * kTokensPerBlock, ...). The bin of r = c_i - s_ij is
// computed in double exactly as MoeBalancer's CPU path: floor((r - lo) * (bins / (hi - lo))), NaN to 0, clamped.
template <typename T>
__global__ void qb_histogram_kernel(const T* __restrict__ scores,
                                    const T* __restrict__ cutoff,
                                    const int32_t* __restrict__ group,
                                    int32_t keep,
                                    u64* hist,
                                    int64_t n,
                                    int e,
                                    int bins,
                                    int eb,
                                    double lo,
                                    double scale) {
    extern __shared__ unsigned local_hist[];  // [eb, bins]
    const int j0 = blockIdx.x * eb, ne = min(eb, e - j0);
    for (int b = threadIdx.x; b < ne * bins; b += blockDim.x) local_hist[b] = 0;
    __syncthreads();
    const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock;
    const int64_t i1 = min(n, i0 + kTokensPerBlock);
    for (int64_t w = threadIdx.x; w < (i1 - i0) * ne; w += blockDim.x) {
        const int64_t i = i0 + w / ne;
        if (group && group[i] != keep) continue;
        const int jj = static_cast<int>(w % ne);
        const double r = static_cast<double>(to_f32(cutoff[i])) - static_cast<double>(to_f32(scores[i * e + j0 + jj]));
        const double t = floor((r - lo) * scale);
        const int bin = isnan(t) ? 0 : static_cast<int>(fmin(fmax(t, 0.0), static_cast<double>(bins - 1)));
        atomicAdd(&local_hist[jj * bins + bin], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < ne * bins; b += blockDim.x)
        if (local_hist[b]) atomicAdd(&hist[static_cast<int64_t>(j0) * bins + b], static_cast<u64>(local_hist[b]));
}

// The same without shared memory (bins too many for one expert's row in shared memory).
template <typename T>
__global__ void qb_histogram_global_kernel(const T* __restrict__ scores,
                                           const T* __restrict__ cutoff,
                                           const int32_t* __restrict__ group,
                                           int32_t keep,
                                           u64* hist,
                                           int64_t n,
                                           int e,
                                           int bins,
                                           double lo,
                                           double scale) {
    for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n * e;
         w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = w / e;
        if (group && group[i] != keep) continue;
        const int j = static_cast<int>(w % e);
        const double r = static_cast<double>(to_f32(cutoff[i])) - static_cast<double>(to_f32(scores[w]));
        const double t = floor((r - lo) * scale);
        const int bin = isnan(t) ? 0 : static_cast<int>(fmin(fmax(t, 0.0), static_cast<double>(bins - 1)));
        atomicAdd(&hist[static_cast<int64_t>(j) * bins + bin], u64{1});
    }
}

// out[i] = -sum_j p_ij ln p_ij / ln E with p_i = s_i / sum s_i (in double), one warp per token.
template <typename T>
__global__ void token_entropy_kernel(const T* __restrict__ scores, double* out, int64_t n, int e, double inv_log_e) {
    const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (i >= n) return;
    double sum = 0.0;
    for (int j = lane; j < e; j += 32) sum += static_cast<double>(to_f32(scores[i * e + j]));
    sum = warp_sum(sum);
    double h = 0.0;
    for (int j = lane; j < e; j += 32) {
        const double p = static_cast<double>(to_f32(scores[i * e + j])) / sum;
        if (p > 0) h -= p * log(p);
    }
    h = warp_sum(h);
    if (lane == 0) out[i] = h * inv_log_e;
}

// acc[0] += sum of v[0..n) in a fixed order (one block).
__global__ void ordered_sum_kernel(const double* __restrict__ v, double* acc, int64_t n) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) acc[0] += s;
}

// Aux loss, pass 1: per token the row sum S_i (1 for probs) into rowsum[i]; per expert the column sums of p over a
// chunk of tokens into partial[chunk, E].
template <typename T>
__global__ void aux_rows_kernel(const T* __restrict__ scores, double* rowsum, int64_t n, int e, bool probs) {
    const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (i >= n) return;
    double sum = 0.0;
    if (!probs) {
        for (int j = lane; j < e; j += 32) sum += static_cast<double>(to_f32(scores[i * e + j]));
        sum = warp_sum(sum);
    }
    if (lane == 0) rowsum[i] = probs ? 1.0 : sum;
}

template <typename T>
__global__ void aux_columns_kernel(
    const T* __restrict__ scores, const double* __restrict__ rowsum, double* p_mean, int64_t n, int e) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= e) return;
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(to_f32(scores[i * e + j])) / rowsum[i];
    p_mean[j] = acc;
}

// dscores: g_j (probs) or (g_j - sum_j' g_j' p_ij') / S_i, with g = d loss / d p (one warp per token).
template <typename T>
__global__ void aux_grad_kernel(const T* __restrict__ scores,
                                const double* __restrict__ rowsum,
                                const double* __restrict__ g,
                                T* __restrict__ dscores,
                                int64_t n,
                                int e,
                                bool probs) {
    const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (i >= n) return;
    const double sum = rowsum[i];
    double dot = 0.0;
    if (!probs) {
        for (int j = lane; j < e; j += 32) dot += g[j] * static_cast<double>(to_f32(scores[i * e + j])) / sum;
        dot = warp_sum(dot);
    }
    for (int j = lane; j < e; j += 32)
        dscores[i * e + j] = from_f32<T>(static_cast<float>(probs ? g[j] : (g[j] - dot) / sum));
}

unsigned warp_blocks(int64_t n) {
    return static_cast<unsigned>((n * 32 + kThreads - 1) / kThreads);
}

// A scratch buffer from the caching allocator, returned in stream order.
struct Scratch {
    explicit Scratch(size_t bytes) : bytes_(std::max<size_t>(bytes, 8)) {
        ptr = core::backend_get(core::Device::cuda).alloc(bytes_);
    }
    ~Scratch() {
        core::backend_get(core::Device::cuda).free(ptr, bytes_);
    }
    void* ptr;
    size_t bytes_;
};

}  // namespace

void moe_expert_counts(const Tensor& indices, const Tensor& counts, const Tensor& group, int32_t keep) {
    check_dtype_in(counts, {DType::i64}, "moe_expert_counts", "counts");
    const int64_t slots = indices.numel();
    const int e = static_cast<int>(counts.numel());
    if (slots == 0) return;
    core::NvtxRange range("moe_expert_counts");
    const unsigned blocks = std::min<unsigned>(grid_for(slots, kThreads), 128);
    expert_counts_kernel<<<blocks, kThreads, static_cast<size_t>(e) * sizeof(unsigned), core::exec_stream()>>>(
        indices.data<int32_t>(),
        group.defined() ? group.data<int32_t>() : nullptr,
        keep,
        static_cast<u64*>(counts.raw()),
        slots,
        static_cast<int>(indices.size(1)),
        e);
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_expert_counts, cuda, moe_expert_counts, ::mt::ops::any_dtype);

void moe_qb_histogram(const Tensor& scores,
                      const Tensor& cutoff,
                      double lower,
                      double upper,
                      const Tensor& hist,
                      const Tensor& group,
                      int32_t keep) {
    constexpr std::string_view op = "moe_qb_histogram";
    check_cuda_float(scores, op, "scores");
    check_dtype_as(cutoff, scores, op, "cutoff", "scores");
    check_dtype_in(hist, {DType::i64}, op, "hist");
    const int64_t n = scores.size(0);
    const int e = static_cast<int>(scores.size(1)), bins = static_cast<int>(hist.size(1));
    if (n == 0) return;
    core::NvtxRange range("moe_qb_histogram");
    const double scale = static_cast<double>(bins) / (upper - lower);
    const int eb = std::min(e, kHistSharedBytes / (bins * static_cast<int>(sizeof(unsigned))));
    MT_CUDA_DISPATCH(scores.dtype(), T, {
        const T* s = static_cast<const T*>(scores.raw());
        const T* c = static_cast<const T*>(cutoff.raw());
        u64* h = static_cast<u64*>(hist.raw());
        const int32_t* g = group.defined() ? group.data<int32_t>() : nullptr;
        if (eb >= 1) {
            const dim3 grid(static_cast<unsigned>((e + eb - 1) / eb),
                            static_cast<unsigned>((n + kTokensPerBlock - 1) / kTokensPerBlock));
            qb_histogram_kernel<T>
                <<<grid, kThreads, static_cast<size_t>(eb * bins) * sizeof(unsigned), core::exec_stream()>>>(
                    s, c, g, keep, h, n, e, bins, eb, lower, scale);
        } else {
            qb_histogram_global_kernel<T><<<grid_for(n * e, kThreads), kThreads, 0, core::exec_stream()>>>(
                s, c, g, keep, h, n, e, bins, lower, scale);
        }
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_qb_histogram, cuda, moe_qb_histogram, ::mt::ops::half_and_float_dtypes);

void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc) {
    constexpr std::string_view op = "moe_token_entropy_sum";
    check_cuda_float(scores, op, "scores");
    check_dtype_in(acc, {DType::f64}, op, "acc");
    const int64_t n = scores.size(0), e = scores.size(1);
    if (n == 0 || e < 2) return;
    core::NvtxRange range("moe_token_entropy_sum");
    Scratch per_token(static_cast<size_t>(n) * sizeof(double));
    auto* v = static_cast<double*>(per_token.ptr);
    MT_CUDA_DISPATCH(scores.dtype(), T, {
        token_entropy_kernel<T><<<warp_blocks(n), kThreads, 0, core::exec_stream()>>>(
            static_cast<const T*>(scores.raw()), v, n, static_cast<int>(e), 1.0 / std::log(static_cast<double>(e)));
    });
    MT_CUDA_CHECK(cudaGetLastError());
    ordered_sum_kernel<<<1, 1024, 0, core::exec_stream()>>>(v, static_cast<double*>(acc.raw()), n);
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(moe_token_entropy_sum, cuda, moe_token_entropy_sum, ::mt::ops::half_and_float_dtypes);

double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores) {
    constexpr std::string_view op = "moe_aux_loss";
    check_cuda_float(scores, op, "scores");
    if (dscores.defined()) check_dtype_as(dscores, scores, op, "dscores", "scores");
    const int64_t n = scores.size(0), e = scores.size(1), k = indices.size(1);
    if (n == 0) return 0.0;
    core::NvtxRange range("moe_aux_loss");
    const cudaStream_t st = core::exec_stream();
    Scratch rows(static_cast<size_t>(n) * sizeof(double)), cols(static_cast<size_t>(e) * sizeof(double));
    Scratch counts(static_cast<size_t>(e) * sizeof(u64)), grad(static_cast<size_t>(e) * sizeof(double));
    auto* rowsum = static_cast<double*>(rows.ptr);
    auto* p_mean = static_cast<double*>(cols.ptr);
    MT_CUDA_CHECK(cudaMemsetAsync(counts.ptr, 0, static_cast<size_t>(e) * sizeof(u64), st));
    const Tensor count_view = Tensor::borrow(counts.ptr, {e}, DType::i64, core::Device::cuda);
    moe_expert_counts(indices, count_view, Tensor(), 0);
    MT_CUDA_DISPATCH(scores.dtype(), T, {
        const T* s = static_cast<const T*>(scores.raw());
        aux_rows_kernel<T><<<warp_blocks(n), kThreads, 0, st>>>(s, rowsum, n, static_cast<int>(e), probs);
        aux_columns_kernel<T>
            <<<static_cast<unsigned>((e + 127) / 128), 128, 0, st>>>(s, rowsum, p_mean, n, static_cast<int>(e));
    });
    MT_CUDA_CHECK(cudaGetLastError());
    std::vector<u64> count_host(static_cast<size_t>(e));
    std::vector<double> p_host(static_cast<size_t>(e)), g(static_cast<size_t>(e));
    MT_CUDA_CHECK(cudaMemcpyAsync(count_host.data(), counts.ptr, e * sizeof(u64), cudaMemcpyDeviceToHost, st));
    MT_CUDA_CHECK(cudaMemcpyAsync(p_host.data(), p_mean, e * sizeof(double), cudaMemcpyDeviceToHost, st));
    MT_CUDA_CHECK(cudaStreamSynchronize(st));
    // the host part of nn::moe_aux_loss, in the same order
    const double t = static_cast<double>(n);
    double loss = 0;
    for (int64_t j = 0; j < e; ++j) {
        const double f = static_cast<double>(e) * static_cast<double>(count_host[static_cast<size_t>(j)]) /
                         (static_cast<double>(k) * t);
        loss += coeff * f * p_host[static_cast<size_t>(j)] / t;
        g[static_cast<size_t>(j)] = coeff * f / t;
    }
    if (!dscores.defined()) return loss;
    MT_CUDA_CHECK(cudaMemcpyAsync(grad.ptr, g.data(), e * sizeof(double), cudaMemcpyHostToDevice, st));
    MT_CUDA_DISPATCH(scores.dtype(), T, {
        aux_grad_kernel<T><<<warp_blocks(n), kThreads, 0, st>>>(static_cast<const T*>(scores.raw()),
                                                                rowsum,
                                                                static_cast<const double*>(grad.ptr),
                                                                static_cast<T*>(dscores.raw()),
                                                                n,
                                                                static_cast<int>(e),
                                                                probs);
    });
    MT_CUDA_CHECK(cudaGetLastError());
    MT_CUDA_CHECK(cudaStreamSynchronize(st));  // g lives on this stack frame
    return loss;
}
MT_REGISTER_KERNEL(moe_aux_loss, cuda, moe_aux_loss, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
