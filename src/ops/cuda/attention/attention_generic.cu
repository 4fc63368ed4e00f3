// Simple CUDA attention for any head dim D <= 256 and for f32, bf16 or f16 storage (fp32 math): one warp per row, each
// lane holding D / 32 (rounded up) elements of the row, dot products reduced across the warp. Used where the
// tensor-core kernels do not apply (f16, f32, or D above 128 or not a multiple of 8); O(T^2 D) work with no tiling,
// fine for small cases.
//   fwd:  one warp per (b, query head, query i), online softmax over keys key_lo(i) <= j <= key_hi(i) (off + i when
//         causal, off = Tk - T; attention_mask.cuh); its running max is the row's max_logit.
//   dq:   one warp per (b, query head, query i), the same keys.
//   dkdv: one warp per (b, kv head, key j < Tk), the group's query heads in order, then the queries
//         first_query(j)..last_query(j), those that see key j (none for some prefix keys: dk, dv = 0): deterministic.
// Also the backward's row term delta = rowsum(dout * out) for both paths.
#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/common.cuh"

namespace mt::ops::cuda {

namespace {

constexpr int kMaxPerLane = 8;  // D <= 256
constexpr int kWarpsPerBlock = 4;

template <typename T>
__device__ __forceinline__ float load_f(const T* p) {
    return to_f32(*p);
}
template <typename T>
__device__ __forceinline__ void store_f(T* p, float v) {
    *p = from_f32<T>(v);
}

// Reads the lane's elements c = lane + 32 e of a D-row into x (0 past D).
template <typename T>
__device__ __forceinline__ void load_row(float (&x)[kMaxPerLane], const T* row, int d, int lane) {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
        const int c = lane + 32 * e;
        x[e] = c < d ? load_f(row + c) : 0.0f;
    }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float (&x)[kMaxPerLane], const T* row, int d, int lane) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
        const int c = lane + 32 * e;
        if (c < d) s += x[e] * load_f(row + c);
    }
    return warp_sum(s);
}

template <typename T>
__device__ __forceinline__ void axpy_row(float (&acc)[kMaxPerLane], float a, const T* row, int d, int lane) {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
        const int c = lane + 32 * e;
        if (c < d) acc[e] += a * load_f(row + c);
    }
}

template <typename T>
__device__ __forceinline__ void store_row(T* row, const float (&x)[kMaxPerLane], float scale, int d, int lane) {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
        const int c = lane + 32 * e;
        if (c < d) store_f(row + c, x[e] * scale);
    }
}

// Global warp index -> (b, head, i) over [B, H, T].
struct RowIndex {
    int b, h, i;
};
__device__ __forceinline__ bool row_index(int64_t w, int heads, int t, int batch, RowIndex* r) {
    if (w >= static_cast<int64_t>(batch) * heads * t) return false;
    r->i = static_cast<int>(w % t);
    r->h = static_cast<int>((w / t) % heads);
    r->b = static_cast<int>(w / (static_cast<int64_t>(t) * heads));
    return true;
}

__device__ __forceinline__ int64_t warp_id() {
    return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}

template <typename T>
__global__ void generic_fwd_kernel(const AttnParams p) {
    RowIndex r;
    if (!row_index(warp_id(), p.hq, p.t, p.b, &r)) return;
    const int lane = threadIdx.x % 32, d = p.d, kh = r.h / (p.hq / p.hkv);
    const int64_t qrs = static_cast<int64_t>(p.hq) * d, krs = static_cast<int64_t>(p.hkv) * d;
    const T* qrow = static_cast<const T*>(p.q) + (static_cast<int64_t>(r.b) * p.t + r.i) * qrs + r.h * d;
    const T* kg = static_cast<const T*>(p.k) + static_cast<int64_t>(r.b) * p.tk * krs + kh * d;
    const T* vg = static_cast<const T*>(p.v) + static_cast<int64_t>(r.b) * p.tk * krs + kh * d;
    float q[kMaxPerLane], acc[kMaxPerLane] = {};
    load_row(q, qrow, d, lane);
    float mx = -INFINITY, sum = 0.0f;
    const int lo = attn_mask::active(p) ? attn_mask::key_lo(p, r.b, r.i) : 0, hi = attn_mask::key_hi(p, r.b, r.i);
    for (int j = lo; j <= hi; ++j) {
        const float s = dot_row(q, kg + j * krs, d, lane) * p.scale;
        const float m_new = fmaxf(mx, s), corr = expf(mx - m_new), pj = expf(s - m_new);
        sum = sum * corr + pj;
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) acc[e] *= corr;
        axpy_row(acc, pj, vg + j * krs, d, lane);
        mx = m_new;
    }
    T* orow = static_cast<T*>(p.out_w) + (static_cast<int64_t>(r.b) * p.t + r.i) * qrs + r.h * d;
    store_row(orow, acc, 1.0f / sum, d, lane);
    if (lane == 0) {
        const int64_t at = (static_cast<int64_t>(r.b) * p.hq + r.h) * p.t + r.i;
        p.lse[at] = mx + logf(sum);
        if (p.max_logit != nullptr) p.max_logit[at] = mx;
    }
}

template <typename T>
__global__ void delta_kernel(const AttnParams p, float* delta) {
    RowIndex r;
    if (!row_index(warp_id(), p.hq, p.t, p.b, &r)) return;
    const int lane = threadIdx.x % 32, d = p.d;
    const int64_t off = (static_cast<int64_t>(r.b) * p.t + r.i) * p.hq * d + static_cast<int64_t>(r.h) * d;
    float x[kMaxPerLane];
    load_row(x, static_cast<const T*>(p.dout) + off, d, lane);
    const float s = dot_row(x, static_cast<const T*>(p.out) + off, d, lane);
    if (lane == 0) delta[(static_cast<int64_t>(r.b) * p.hq + r.h) * p.t + r.i] = s;
}

template <typename T>
__global__ void generic_dq_kernel(const AttnParams p) {
    RowIndex r;
    if (!row_index(warp_id(), p.hq, p.t, p.b, &r)) return;
    const int lane = threadIdx.x % 32, d = p.d, kh = r.h / (p.hq / p.hkv);
    const int64_t qrs = static_cast<int64_t>(p.hq) * d, krs = static_cast<int64_t>(p.hkv) * d;
    const int64_t qoff = (static_cast<int64_t>(r.b) * p.t + r.i) * qrs + r.h * d;
    const T* kg = static_cast<const T*>(p.k) + static_cast<int64_t>(r.b) * p.tk * krs + kh * d;
    const T* vg = static_cast<const T*>(p.v) + static_cast<int64_t>(r.b) * p.tk * krs + kh * d;
    const int64_t row = (static_cast<int64_t>(r.b) * p.hq + r.h) * p.t + r.i;
    const float lse = p.lse[row], delta = p.delta[row];
    float q[kMaxPerLane], dout[kMaxPerLane], acc[kMaxPerLane] = {};
    load_row(q, static_cast<const T*>(p.q) + qoff, d, lane);
    load_row(dout, static_cast<const T*>(p.dout) + qoff, d, lane);
    const int lo = attn_mask::active(p) ? attn_mask::key_lo(p, r.b, r.i) : 0, hi = attn_mask::key_hi(p, r.b, r.i);
    for (int j = lo; j <= hi; ++j) {
        const float pj = expf(dot_row(q, kg + j * krs, d, lane) * p.scale - lse);
        const float ds = pj * (dot_row(dout, vg + j * krs, d, lane) - delta);
        axpy_row(acc, ds, kg + j * krs, d, lane);
    }
    store_row(static_cast<T*>(p.dq) + qoff, acc, p.scale, d, lane);
}

template <typename T>
__global__ void generic_dkdv_kernel(const AttnParams p) {
    RowIndex r;  // r.h is the kv head, r.i the key position
    if (!row_index(warp_id(), p.hkv, p.tk, p.b, &r)) return;
    const int lane = threadIdx.x % 32, d = p.d, group = p.hq / p.hkv, j = r.i;
    const int64_t qrs = static_cast<int64_t>(p.hq) * d, krs = static_cast<int64_t>(p.hkv) * d;
    const int64_t koff = (static_cast<int64_t>(r.b) * p.tk + j) * krs + r.h * d;
    float k[kMaxPerLane], v[kMaxPerLane], dk[kMaxPerLane] = {}, dv[kMaxPerLane] = {};
    load_row(k, static_cast<const T*>(p.k) + koff, d, lane);
    load_row(v, static_cast<const T*>(p.v) + koff, d, lane);
    // The queries first..last all see key j (key_lo never decreases); last < first when none does.
    const int first = attn_mask::first_query(p, r.b, j), last = attn_mask::last_query(p, r.b, j);
    for (int h = r.h * group; h < (r.h + 1) * group; ++h) {
        const T* qg = static_cast<const T*>(p.q) + static_cast<int64_t>(r.b) * p.t * qrs + h * d;
        const T* dog = static_cast<const T*>(p.dout) + static_cast<int64_t>(r.b) * p.t * qrs + h * d;
        const int64_t row0 = (static_cast<int64_t>(r.b) * p.hq + h) * p.t;
        for (int i = first; i <= last; ++i) {
            const float pij = expf(dot_row(k, qg + i * qrs, d, lane) * p.scale - p.lse[row0 + i]);
            const float ds = pij * (dot_row(v, dog + i * qrs, d, lane) - p.delta[row0 + i]);
            axpy_row(dv, pij, dog + i * qrs, d, lane);
            axpy_row(dk, ds, qg + i * qrs, d, lane);
        }
    }
    store_row(static_cast<T*>(p.dk) + koff, dk, p.scale, d, lane);
    store_row(static_cast<T*>(p.dv) + koff, dv, 1.0f, d, lane);
}

unsigned blocks_for_rows(int64_t rows) {
    return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename T>
void generic_fwd(const AttnParams& p) {
    generic_fwd_kernel<T>
        <<<blocks_for_rows(static_cast<int64_t>(p.b) * p.hq * p.t), kWarpsPerBlock * 32, 0, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void generic_bwd(const AttnParams& p) {
    generic_dq_kernel<T>
        <<<blocks_for_rows(static_cast<int64_t>(p.b) * p.hq * p.t), kWarpsPerBlock * 32, 0, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
    generic_dkdv_kernel<T>
        <<<blocks_for_rows(static_cast<int64_t>(p.b) * p.hkv * p.tk), kWarpsPerBlock * 32, 0, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention_generic_fwd(const AttnParams& p, DType dtype) {
    MT_CUDA_DISPATCH(dtype, T, generic_fwd<T>(p));
}

void attention_generic_bwd(const AttnParams& p, DType dtype) {
    MT_CUDA_DISPATCH(dtype, T, generic_bwd<T>(p));
}

void attention_delta(const AttnParams& p, float* delta, DType dtype) {
    const unsigned blocks = blocks_for_rows(static_cast<int64_t>(p.b) * p.hq * p.t);
    MT_CUDA_DISPATCH(dtype, T, delta_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, core::exec_stream()>>>(p, delta));
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::ops::cuda
