// Shared pieces of the CUDA Block AttnRes mix (ops/attnres_mix.h; kernels in attnres_mix_fwd.cu and
// attnres_mix_bwd.cu). Both directions give each token row to one warp: a lane walks the columns lane * VEC,
// (lane + 32) * VEC, ... with VEC = 8 (16-byte loads of bf16/f16, two of f32) where C and every pointer allow it, and
// the per-token sums over C are warp butterflies (prim/warp.cuh), so there is no __syncthreads per token and the sums
// have a fixed order. The source count M is a template argument for 1..kMaxFixedM, which puts the per-source sums in
// registers; M = 0 is the generic kernel for any m <= kMaxM (arrays indexed at run time, in local memory).
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cuda/common.cuh"

namespace mt::ops::cuda::attnres {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kMaxM = 32;      // ops/attnres_mix.h's kAttnResMaxSources
constexpr int kMaxFixedM = 8;  // source counts with their own kernels
constexpr int kVec = 8;        // elements per lane access on the vector path
constexpr int kDtypeBf16 = 0, kDtypeF16 = 1, kDtypeF32 = 2;

struct Sources {
    const void* v[kMaxM];
};

// query and key_gain, of any float dtype. The dtype is a run-time value rather than a template argument: both are
// read once per column vector beside the m source vectors, so a warp-uniform switch costs nothing measurable, and
// it keeps the kernel count at (source dtype) x (gradient dtype) x (source count) instead of three times that.
struct QueryGain {
    const void* query;
    const void* gain;
    int dtype;  // kDtype*
};

// VEC elements of a float vector of run-time dtype `code` from element k on.
template <int VEC>
__device__ __forceinline__ void load_any(const void* p, int code, int64_t k, float (&out)[VEC]) {
    if (code == kDtypeBf16)
        load_vec<VEC>(static_cast<const bf16*>(p) + k, out);
    else if (code == kDtypeF16)
        load_vec<VEC>(static_cast<const f16*>(p) + k, out);
    else
        load_vec<VEC>(static_cast<const float*>(p) + k, out);
}

// q[k..k+VEC) = query * key_gain (the effective query of the logits).
template <int VEC>
__device__ __forceinline__ void load_q(const QueryGain& qg, int64_t k, float (&q)[VEC]) {
    float g[VEC];
    load_any<VEC>(qg.query, qg.dtype, k, q);
    load_any<VEC>(qg.gain, qg.dtype, k, g);
#pragma unroll
    for (int e = 0; e < VEC; ++e) q[e] *= g[e];
}

// How many VEC-wide steps lane `lane` takes along a row of c columns; step i covers columns (lane + 32 i) VEC ...
__device__ __forceinline__ int64_t lane_steps(int64_t c, int lane, int vec) {
    const int64_t first = static_cast<int64_t>(lane) * vec;
    return first < c ? (c - first + 32 * vec - 1) / (32 * vec) : 0;
}

// The first pass over one token row (the caller's warp): per source j < m, ss[j] = sum v_j^2, qs[j] = sum q v_j
// and, where dh is given (kDh), da[j] = sum dh v_j, each lane over its own columns in order; the butterflies are the
// caller's. kM is the arrays' size (M, or kMaxM for the generic M = 0).
template <typename T, int M, int VEC, bool kDh, int kM>
__device__ __forceinline__ void row_sums(const Sources& src,
                                         const QueryGain& qg,
                                         const T* dh,
                                         int m,
                                         int64_t row,
                                         int64_t c,
                                         int64_t steps,
                                         float (&ss)[kM],
                                         float (&qs)[kM],
                                         float (&da)[kM]) {
    constexpr int kUnroll = M > 0 ? M : 1;
    const int lane = threadIdx.x % 32;
#pragma unroll kUnroll
    for (int j = 0; j < m; ++j) ss[j] = qs[j] = da[j] = 0.0f;
        // Two steps of loads in flight: this pass has no stores to wait for.
#pragma unroll 2
    for (int64_t i = 0; i < steps; ++i) {
        const int64_t k = (lane + 32 * i) * VEC;
        float q[VEC], d[VEC];
        load_q<VEC>(qg, k, q);
        if constexpr (kDh) load_vec<VEC>(dh + row * c + k, d);
#pragma unroll kUnroll
        for (int j = 0; j < m; ++j) {
            float x[VEC];
            load_vec<VEC>(static_cast<const T*>(src.v[j]) + row * c + k, x);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                ss[j] += x[e] * x[e];
                qs[j] += q[e] * x[e];
                if constexpr (kDh) da[j] += d[e] * x[e];
            }
        }
    }
}

// This warp's index in the grid and the number of warps (the kernels walk their rows or chunks grid-stride).
__device__ __forceinline__ int64_t grid_warp() {
    return static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t grid_warps() {
    return static_cast<int64_t>(gridDim.x) * kWarps;
}

// Host side.

inline int dtype_code(DType d) {
    return d == DType::bf16 ? kDtypeBf16 : (d == DType::f16 ? kDtypeF16 : kDtypeF32);
}

inline Sources sources_of(const std::vector<Tensor>& sources) {
    Sources s{};
    for (size_t j = 0; j < sources.size(); ++j) s.v[j] = sources[j].raw();
    return s;
}

inline QueryGain query_gain_of(const Tensor& query, const Tensor& gain) {
    return {query.raw(), gain.raw(), dtype_code(query.dtype())};
}

// Whether the vector path applies: c a multiple of kVec and every row base aligned for kVec-wide access.
inline bool vec_path(int64_t c, const std::vector<Tensor>& rows, std::initializer_list<const Tensor*> others) {
    for (const Tensor& t : rows)
        if (!vec_ok(c, {&t})) return false;
    return vec_ok(c, others);
}

// Blocks of the grid for `units` rows (forward) or token chunks (backward) whose second pass re-reads row_bytes of
// sources each. The grid holds about kRowBytesPerSm of such rows per SM, so a row is still in L1 (or L2) when its
// second pass re-reads it (in reverse column order, newest first); more warps in flight would evict it and turn the
// re-read into a second trip to memory. Each warp then takes ceil(units / warps) units, the warp count trimmed so
// that the last round is full. The result does not depend on the grid: a unit is one warp's whole work.
inline unsigned mix_grid(int64_t units, int64_t row_bytes) {
    constexpr int64_t kRowBytesPerSm = 192 << 10, kMinWarpsPerSm = 8, kMaxWarpsPerSm = 16;
    static const int sms = [] {
        int dev = 0, v = 0;
        MT_CUDA_CHECK(cudaGetDevice(&dev));
        MT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
        return v;
    }();
    const int64_t per_sm = std::clamp(kRowBytesPerSm / std::max<int64_t>(row_bytes, 1), kMinWarpsPerSm, kMaxWarpsPerSm);
    const int64_t cap = std::max<int64_t>(sms, 1) * per_sm;
    const int64_t per_warp = (units + cap - 1) / cap;
    const int64_t warps = (units + per_warp - 1) / per_warp;
    return static_cast<unsigned>((warps + kWarps - 1) / kWarps);
}

// Calls launch(M, VEC) (std::integral_constant values) for the kernel that takes m sources: the fixed-M vector
// kernels for m <= kMaxFixedM, the generic one (M = 0) otherwise or where the vector path does not apply.
template <typename Launch>
void with_mix_kernel(int m, bool vec, const Launch& launch) {
    using V8 = std::integral_constant<int, kVec>;
    using Generic = std::integral_constant<int, 0>;
    if (!vec) return launch(Generic{}, std::integral_constant<int, 1>{});
    switch (m) {
        case 1:
            return launch(std::integral_constant<int, 1>{}, V8{});
        case 2:
            return launch(std::integral_constant<int, 2>{}, V8{});
        case 3:
            return launch(std::integral_constant<int, 3>{}, V8{});
        case 4:
            return launch(std::integral_constant<int, 4>{}, V8{});
        case 5:
            return launch(std::integral_constant<int, 5>{}, V8{});
        case 6:
            return launch(std::integral_constant<int, 6>{}, V8{});
        case 7:
            return launch(std::integral_constant<int, 7>{}, V8{});
        case 8:
            return launch(std::integral_constant<int, 8>{}, V8{});
        default:
            return launch(Generic{}, V8{});
    }
}

inline void check_common(const std::vector<Tensor>& sources,
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

}  // namespace mt::ops::cuda::attnres
