// CUDA Block AttnRes mix (ops/attnres_mix.h). Forward: one thread block per token, every thread summing its
// columns' squares and query dots for all m sources at once, one fixed-order block reduction of the 2m sums, the
// softmax on one warp, then h = sum_j alpha_j v_j. Backward: one thread block per kTokens tokens; the per-token sums
// (squares, query dots and dh dots: 3m values) are reduced the same way, dv is accumulated in place (each element
// has one owner), and the query/gain gradients go to a [blocks, 2, C] partial buffer that a second kernel sums in
// block order: deterministic, no atomics.
#include "ops/attnres_mix.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxM = 32;    // ops/attnres_mix.h's kAttnResMaxSources
constexpr int kTokens = 16;  // tokens per backward block (rows of one partial sum of dquery/dkey_gain)

struct Sources {
    const void* v[kMaxM];
};
struct Grads {
    void* dv[kMaxM];
};

// Sums vals[0..count) over the block in a fixed order (warp butterflies, then warps in order); every thread gets the
// totals in out (shared, count values). scratch holds kWarps * count floats.
__device__ void block_sums(const float* vals, int count, float* scratch, float* out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = 0; i < count; ++i) {
        const float x = warp_sum(vals[i]);
        if (lane == 0) scratch[warp * count + i] = x;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        float t = 0.0f;
        for (int w = 0; w < kWarps; ++w) t += scratch[w * count + i];
        out[i] = t;
    }
    __syncthreads();
}

template <typename TQ>
__device__ __forceinline__ float q_at(const TQ* query, const TQ* gain, int64_t k) {
    return to_f32(query[k]) * to_f32(gain[k]);
}

// sums[0..m): sum of squares; sums[m..2m): q . v (per source, this token).
template <typename T, typename TQ>
__device__ void token_sums(
    const Sources& src, const TQ* query, const TQ* gain, int m, int64_t row, int64_t c, float* scratch, float* out) {
    float acc[2 * kMaxM];
    for (int j = 0; j < 2 * m; ++j) acc[j] = 0.0f;
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        const float q = q_at(query, gain, k);
        for (int j = 0; j < m; ++j) {
            const float x = to_f32(static_cast<const T*>(src.v[j])[row * c + k]);
            acc[j] += x * x;
            acc[m + j] += q * x;
        }
    }
    block_sums(acc, 2 * m, scratch, out);
}

template <typename T, typename TQ>
__global__ void mix_fwd_kernel(
    Sources src, const TQ* query, const TQ* gain, float eps, T* h, float* alpha, int m, int64_t c, float blend) {
    __shared__ float scratch[kWarps * 2 * kMaxM], sums[2 * kMaxM], a[kMaxM];
    const int64_t row = blockIdx.x;
    token_sums<T>(src, query, gain, m, row, c, scratch, sums);
    if (threadIdx.x == 0) {
        float s[kMaxM], smax = -INFINITY, total = 0.0f;
        for (int j = 0; j < m; ++j) {
            s[j] = sums[m + j] / sqrtf(sums[j] / static_cast<float>(c) + eps);
            smax = fmaxf(smax, s[j]);
        }
        for (int j = 0; j < m; ++j) total += (s[j] = expf(s[j] - smax));
        for (int j = 0; j < m; ++j) {
            alpha[row * m + j] = s[j] / total;
            a[j] = blend / static_cast<float>(m) + (1.0f - blend) * (s[j] / total);  // the value weight w_j
        }
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < m; ++j) acc += a[j] * to_f32(static_cast<const T*>(src.v[j])[row * c + k]);
        h[row * c + k] = from_f32<T>(acc);
    }
}

// Per token (see the CPU reference, ops/cpu/attnres_mix.cpp):
//   dv_j += w_j dh + ds_j / r_j (q - u_j s_j / C), w_j = blend / m + (1 - blend) a_j, ds_j scaled by (1 - blend);
//   partial dquery += ds_j gain u_j, dgain += ds_j query u_j.
template <typename T, typename TQ, typename TD>
__global__ void mix_bwd_kernel(Sources src,
                               const TQ* query,
                               const TQ* gain,
                               float eps,
                               const float* alpha,
                               const T* dh,
                               Grads grads,
                               float* partial,
                               int m,
                               int64_t n,
                               int64_t c,
                               float blend) {
    __shared__ float scratch[kWarps * 3 * kMaxM], sums[3 * kMaxM], coef[3 * kMaxM];
    float* pq = partial + blockIdx.x * 2 * c;  // [c]
    float* pg = pq + c;                        // [c]
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) pq[k] = pg[k] = 0.0f;
    for (int64_t row = blockIdx.x * kTokens; row < n && row < (blockIdx.x + 1) * int64_t{kTokens}; ++row) {
        float acc[3 * kMaxM];
        for (int j = 0; j < 3 * m; ++j) acc[j] = 0.0f;
        for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
            const float q = q_at(query, gain, k), d = to_f32(dh[row * c + k]);
            for (int j = 0; j < m; ++j) {
                const float x = to_f32(static_cast<const T*>(src.v[j])[row * c + k]);
                acc[j] += x * x;
                acc[m + j] += q * x;
                acc[2 * m + j] += d * x;
            }
        }
        block_sums(acc, 3 * m, scratch, sums);
        if (threadIdx.x == 0) {
            const float* a = alpha + row * m;
            float mean_da = 0.0f;
            for (int j = 0; j < m; ++j) mean_da += a[j] * sums[2 * m + j];
            for (int j = 0; j < m; ++j) {
                const float r = sqrtf(sums[j] / static_cast<float>(c) + eps);
                const float ds = (1.0f - blend) * a[j] * (sums[2 * m + j] - mean_da);
                coef[j] = blend / static_cast<float>(m) + (1.0f - blend) * a[j];  // times dh
                coef[m + j] = ds / r;                                             // times q
                coef[2 * m + j] = ds / r * (sums[m + j] / r) / (c * r);  // times v (u s / C / r with u = v / r)
                scratch[j] = ds / r;                                     // times v: ds u_j = ds / r v
            }
        }
        __syncthreads();
        for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
            const float q = q_at(query, gain, k), d = to_f32(dh[row * c + k]);
            const float qk = to_f32(query[k]), gk = to_f32(gain[k]);
            float gq = 0.0f;
            for (int j = 0; j < m; ++j) {
                const float x = to_f32(static_cast<const T*>(src.v[j])[row * c + k]);
                TD* dv = static_cast<TD*>(grads.dv[j]) + row * c + k;
                *dv = from_f32<TD>(to_f32(*dv) + coef[j] * d + coef[m + j] * q - coef[2 * m + j] * x);
                gq += scratch[j] * x;
            }
            pq[k] += gq * gk;
            pg[k] += gq * qk;
        }
        __syncthreads();  // coef and scratch are rewritten by the next token
    }
}

// dquery[k] += sum over blocks (in order) of partial[b, 0, k]; dgain likewise from partial[b, 1, k].
__global__ void partial_sum_kernel(const float* partial, int64_t blocks, int64_t c, float* dquery, float* dgain) {
    const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (k >= c) return;
    float sq = 0.0f, sg = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
        sq += partial[b * 2 * c + k];
        sg += partial[b * 2 * c + c + k];
    }
    dquery[k] += sq;
    dgain[k] += sg;
}

Sources sources_of(const std::vector<Tensor>& sources) {
    Sources s{};
    for (size_t j = 0; j < sources.size(); ++j) s.v[j] = sources[j].raw();
    return s;
}

void check_common(const std::vector<Tensor>& sources,
                  const Tensor& query,
                  const Tensor& key_gain,
                  const Tensor& alpha,
                  std::string_view op) {
    MT_CHECK(static_cast<int>(sources.size()) <= kMaxM, "{}: at most {} sources", op, kMaxM);
    check_cuda_float(sources[0], op, "sources");
    check_cuda_float(query, op, "query");
    check_dtype_as(key_gain, query, op, "key_gain", "query");
    check_f32(alpha, op, "alpha");
}

}  // namespace

void attnres_mix_fwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& h,
                     const Tensor& alpha,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_fwd";
    check_common(sources, query, key_gain, alpha, op);
    check_dtype_as(h, sources[0], op, "h", "the sources");
    const int64_t n = sources[0].size(0), c = sources[0].size(1);
    const int m = static_cast<int>(sources.size());
    if (n == 0) return;
    core::NvtxRange range("attnres_mix_fwd");
    MT_CUDA_DISPATCH(sources[0].dtype(), T, MT_CUDA_DISPATCH(query.dtype(), TQ, {
                         mix_fwd_kernel<T, TQ><<<static_cast<unsigned>(n), kThreads, 0, core::exec_stream()>>>(
                             sources_of(sources),
                             static_cast<const TQ*>(query.raw()),
                             static_cast<const TQ*>(key_gain.raw()),
                             static_cast<float>(eps),
                             static_cast<T*>(h.raw()),
                             alpha.data<float>(),
                             m,
                             c,
                             static_cast<float>(blend));
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(attnres_mix_fwd, cuda, attnres_mix_fwd, ::mt::ops::half_and_float_dtypes);

void attnres_mix_bwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& alpha,
                     const Tensor& dh,
                     const std::vector<Tensor>& d_sources,
                     const Tensor& dquery,
                     const Tensor& dkey_gain,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_bwd";
    check_common(sources, query, key_gain, alpha, op);
    check_dtype_as(dh, sources[0], op, "dh", "the sources");
    check_f32(dquery, op, "dquery");
    check_f32(dkey_gain, op, "dkey_gain");
    const DType dv_dtype = d_sources[0].dtype();
    MT_CHECK(dv_dtype == DType::f32 || dv_dtype == sources[0].dtype(),
             "{}: d_sources have dtype {}, expected f32 or {} (the sources' dtype)",
             op,
             core::dtype_name(dv_dtype),
             core::dtype_name(sources[0].dtype()));
    Grads g{};
    for (size_t j = 0; j < d_sources.size(); ++j) {
        check_dtype_as(d_sources[j], d_sources[0], op, "d_sources[j]", "d_sources[0]");
        g.dv[j] = d_sources[j].raw();
    }
    const int64_t n = sources[0].size(0), c = sources[0].size(1);
    const int m = static_cast<int>(sources.size());
    if (n == 0) return;
    core::NvtxRange range("attnres_mix_bwd");
    const int64_t blocks = (n + kTokens - 1) / kTokens;
    const Tensor partial = Tensor::scratch({blocks, 2, c}, DType::f32, core::Device::cuda);
    MT_CUDA_DISPATCH(sources[0].dtype(), T, MT_CUDA_DISPATCH(query.dtype(), TQ, {
                         auto launch = [&](auto* dv_type) {
                             using TD = std::remove_pointer_t<decltype(dv_type)>;
                             mix_bwd_kernel<T, TQ, TD>
                                 <<<static_cast<unsigned>(blocks), kThreads, 0, core::exec_stream()>>>(
                                     sources_of(sources),
                                     static_cast<const TQ*>(query.raw()),
                                     static_cast<const TQ*>(key_gain.raw()),
                                     static_cast<float>(eps),
                                     alpha.data<float>(),
                                     static_cast<const T*>(dh.raw()),
                                     g,
                                     partial.data<float>(),
                                     m,
                                     n,
                                     c,
                                     static_cast<float>(blend));
                         };
                         if (dv_dtype == DType::f32)
                             launch(static_cast<float*>(nullptr));
                         else
                             launch(static_cast<T*>(nullptr));
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    partial_sum_kernel<<<static_cast<unsigned>((c + 255) / 256), 256, 0, core::exec_stream()>>>(
        partial.data<float>(), blocks, c, dquery.data<float>(), dkey_gain.data<float>());
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(attnres_mix_bwd, cuda, attnres_mix_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
