// CUDA global-token and sink merge of attention (ops/attention_global.h). G <= 32 global keys, D <= 256.
//   fwd:     one warp per (token, query head): the G scores (lane j keeps s_j), the merged lse' and, in place,
//            out' = exp(lse - lse') out + sum_j exp(s_j - lse') vg_j.
//   bwd row: one warp per (token, query head): delta = dout . out', p_j and ds_j, dq += sum_j ds_j kg_j / sqrt(D);
//            p_j and ds_j go to an f32 scratch [rows, G], and the sink term -exp(b_h - lse') delta to [rows].
//   bwd sums: dkg and dvg per (j, kv head) over chunks of kChunk tokens into f32 partials, then the partials summed
//            in chunk order; dsink per head by one block's fixed-order reduction. No atomics: deterministic.
#include <cmath>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "ops/attention_global.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kMaxGlobal = 32, kMaxHeadDim = 256, kWarps = 4, kChunk = 1024, kSumThreads = 128;
constexpr int kPerLane = kMaxHeadDim / 32;  // a row's columns per lane

struct GlobalParams {
    const void* q = nullptr;
    const void* kg = nullptr;
    const void* vg = nullptr;
    const void* sink = nullptr;
    bool sink_f32 = false;  // sink in f32, else in the dtype of q
    void* out = nullptr;
    float* lse = nullptr;
    const void* dout = nullptr;
    void* dq = nullptr;
    float* p = nullptr;   // scratch [rows, G]: p_j
    float* ds = nullptr;  // scratch [rows, G]: ds_j
    float* ps = nullptr;  // scratch [rows]: -exp(b_h - lse') delta
    int64_t tokens = 0;   // B T
    int t = 0, hq = 0, hkv = 0, g = 0, d = 0;
    float scale = 0;
};

template <typename T>
__device__ __forceinline__ float dot_rows(const T* a, const T* b, int d, int lane) {
    float s = 0.0f;
    for (int c = lane; c < d; c += 32) s += to_f32(a[c]) * to_f32(b[c]);
    return warp_sum(s);
}

template <typename T>
__device__ __forceinline__ float sink_of(const GlobalParams& p, int h) {
    return p.sink_f32 ? static_cast<const float*>(p.sink)[h] : to_f32(static_cast<const T*>(p.sink)[h]);
}

// Row r = token * hq + h: the scores s_j (lane j holds s_j, -inf past G) and lse' returned.
template <typename T>
__device__ __forceinline__ float merge_lse(
    const GlobalParams& p, const T* qrow, int kh, int h, float lse, float& s_mine, int lane) {
    const T* kg = static_cast<const T*>(p.kg);
    s_mine = -INFINITY;
    for (int j = 0; j < p.g; ++j) {
        const float s = dot_rows(qrow, kg + (static_cast<int64_t>(j) * p.hkv + kh) * p.d, p.d, lane) * p.scale;
        if (lane == j) s_mine = s;
    }
    const float sink = p.sink != nullptr ? sink_of<T>(p, h) : -INFINITY;
    const float mx = fmaxf(fmaxf(lse, sink), warp_max(s_mine));
    const float sum = warp_sum(lane < p.g ? expf(s_mine - mx) : 0.0f) + expf(lse - mx) + expf(sink - mx);
    return mx + logf(sum);
}

template <typename T>
__global__ void global_fwd_kernel(const GlobalParams p) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= p.tokens * p.hq) return;
    const int lane = threadIdx.x % 32, h = static_cast<int>(r % p.hq), kh = h / (p.hq / p.hkv);
    const int64_t token = r / p.hq, bb = token / p.t, i = token % p.t;
    const T* qrow = static_cast<const T*>(p.q) + r * p.d;
    T* orow = static_cast<T*>(p.out) + r * p.d;
    float& lse = p.lse[(bb * p.hq + h) * p.t + i];
    float s_mine;
    const float merged = merge_lse(p, qrow, kh, h, lse, s_mine, lane);
    const float keep = expf(lse - merged);
    const T* vg = static_cast<const T*>(p.vg);
    float o[kPerLane];  // columns lane + 32 e
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
        const int c = lane + 32 * e;
        o[e] = c < p.d ? to_f32(orow[c]) * keep : 0.0f;
    }
    for (int j = 0; j < p.g; ++j) {  // every lane takes part in the shuffle
        const float pj = expf(__shfl_sync(0xffffffffu, s_mine, j) - merged);
        const T* vrow = vg + (static_cast<int64_t>(j) * p.hkv + kh) * p.d;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e)
            if (lane + 32 * e < p.d) o[e] += pj * to_f32(vrow[lane + 32 * e]);
    }
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
        if (lane + 32 * e < p.d) orow[lane + 32 * e] = from_f32<T>(o[e]);
    __syncwarp();
    if (lane == 0) lse = merged;
}

template <typename T>
__global__ void global_bwd_rows_kernel(const GlobalParams p) {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= p.tokens * p.hq) return;
    const int lane = threadIdx.x % 32, h = static_cast<int>(r % p.hq), kh = h / (p.hq / p.hkv);
    const int64_t token = r / p.hq, bb = token / p.t, i = token % p.t;
    const T* qrow = static_cast<const T*>(p.q) + r * p.d;
    const T* dorow = static_cast<const T*>(p.dout) + r * p.d;
    const float l = p.lse[(bb * p.hq + h) * p.t + i];
    const float delta = dot_rows(dorow, static_cast<const T*>(p.out) + r * p.d, p.d, lane);
    const T* kg = static_cast<const T*>(p.kg);
    const T* vg = static_cast<const T*>(p.vg);
    float pj_mine = 0.0f, dsj_mine = 0.0f;
    for (int j = 0; j < p.g; ++j) {
        const int64_t off = (static_cast<int64_t>(j) * p.hkv + kh) * p.d;
        const float pj = expf(dot_rows(qrow, kg + off, p.d, lane) * p.scale - l);
        const float dsj = pj * (dot_rows(dorow, vg + off, p.d, lane) - delta);
        if (lane == j) pj_mine = pj, dsj_mine = dsj;
    }
    T* dqrow = static_cast<T*>(p.dq) + r * p.d;
    float acc[kPerLane];  // columns lane + 32 e
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[e] = lane + 32 * e < p.d ? to_f32(dqrow[lane + 32 * e]) : 0.0f;
    for (int j = 0; j < p.g; ++j) {  // every lane takes part in the shuffle
        const float dsj = __shfl_sync(0xffffffffu, dsj_mine, j) * p.scale;
        const T* krow = kg + (static_cast<int64_t>(j) * p.hkv + kh) * p.d;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e)
            if (lane + 32 * e < p.d) acc[e] += dsj * to_f32(krow[lane + 32 * e]);
    }
    if (p.g > 0) {
#pragma unroll
        for (int e = 0; e < kPerLane; ++e)
            if (lane + 32 * e < p.d) dqrow[lane + 32 * e] = from_f32<T>(acc[e]);
    }
    if (p.g > 0 && lane < p.g) {
        p.p[r * p.g + lane] = pj_mine;
        p.ds[r * p.g + lane] = dsj_mine;
    }
    if (p.sink != nullptr && lane == 0) p.ps[r] = -expf(sink_of<T>(p, h) - l) * delta;
}

// Block (chunk, j * hkv + kh): the chunk's sums of ds_j q / sqrt(D) and p_j dout over the group's heads, per column,
// into partial[chunk][j * hkv + kh][2][D].
template <typename T>
__global__ void global_bwd_partial_kernel(const GlobalParams p, float* partial) {
    const int64_t chunk = blockIdx.x;
    const int jk = blockIdx.y, j = jk / p.hkv, kh = jk % p.hkv, group = p.hq / p.hkv;
    const int64_t first = chunk * kChunk, last = min(first + kChunk, p.tokens);
    for (int c = threadIdx.x; c < p.d; c += blockDim.x) {
        float dk = 0.0f, dv = 0.0f;
        for (int64_t token = first; token < last; ++token)
            for (int h = kh * group; h < (kh + 1) * group; ++h) {
                const int64_t r = token * p.hq + h;
                dk += p.ds[r * p.g + j] * to_f32(static_cast<const T*>(p.q)[r * p.d + c]);
                dv += p.p[r * p.g + j] * to_f32(static_cast<const T*>(p.dout)[r * p.d + c]);
            }
        float* out = partial + ((chunk * gridDim.y + jk) * 2) * p.d;
        out[c] = dk * p.scale;
        out[p.d + c] = dv;
    }
}

template <typename T>
__global__ void global_bwd_reduce_kernel(const GlobalParams p, const float* partial, int chunks, T* dkg, T* dvg) {
    const int jk = blockIdx.x, slots = gridDim.x;
    for (int c = threadIdx.x; c < p.d; c += blockDim.x) {
        float dk = 0.0f, dv = 0.0f;
        for (int ch = 0; ch < chunks; ++ch) {
            const float* in = partial + ((static_cast<int64_t>(ch) * slots + jk) * 2) * p.d;
            dk += in[c];
            dv += in[p.d + c];
        }
        dkg[static_cast<int64_t>(jk) * p.d + c] = from_f32<T>(dk);
        dvg[static_cast<int64_t>(jk) * p.d + c] = from_f32<T>(dv);
    }
}

// Block h: dsink[h] += the sum over tokens of the sink terms, in a fixed order.
template <typename D>
__global__ void global_bwd_sink_kernel(const GlobalParams p, D* dsink) {
    __shared__ float scratch[32];
    const int h = blockIdx.x;
    float acc = 0.0f;
    for (int64_t token = threadIdx.x; token < p.tokens; token += blockDim.x) acc += p.ps[token * p.hq + h];
    const float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) dsink[h] = from_f32<D>(to_f32(dsink[h]) + total);
}

GlobalParams make_params(const Tensor& q,
                         const Tensor& kg,
                         const Tensor& vg,
                         const Tensor& sink,
                         const Tensor& out,
                         const Tensor& lse,
                         std::string_view op) {
    check_cuda_float(q, op, "q");
    for (const NamedArg& a : {NamedArg{"kg", kg}, NamedArg{"vg", vg}, NamedArg{"out", out}})
        if (a.tensor.defined()) check_dtype_as(a.tensor, q, op, a.name, "q");
    check_f32(lse, op, "lse");
    if (sink.defined()) check_dtype_in(sink, {q.dtype(), DType::f32}, op, "sink");
    MT_CHECK(q.size(3) <= kMaxHeadDim, "{}: head dim {} is above the CUDA limit {}", op, q.size(3), kMaxHeadDim);
    MT_CHECK(!kg.defined() || kg.size(0) <= kMaxGlobal,
             "{}: {} global tokens; the CUDA kernels take at most {}",
             op,
             kg.defined() ? kg.size(0) : 0,
             kMaxGlobal);
    GlobalParams p;
    p.q = q.raw();
    p.kg = kg.defined() ? kg.raw() : nullptr;
    p.vg = vg.defined() ? vg.raw() : nullptr;
    p.sink = sink.defined() ? sink.raw() : nullptr;
    p.sink_f32 = sink.defined() && sink.dtype() == DType::f32;
    p.out = out.raw();
    p.lse = lse.data<float>();
    p.tokens = q.size(0) * q.size(1);
    p.t = static_cast<int>(q.size(1));
    p.hq = static_cast<int>(q.size(2));
    p.hkv = kg.defined() ? static_cast<int>(kg.size(1)) : 1;
    p.g = kg.defined() ? static_cast<int>(kg.size(0)) : 0;
    p.d = static_cast<int>(q.size(3));
    p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.d)));
    return p;
}

unsigned row_blocks(const GlobalParams& p) {
    return static_cast<unsigned>((p.tokens * p.hq + kWarps - 1) / kWarps);
}

}  // namespace

void attention_global_fwd(
    const Tensor& q, const Tensor& kg, const Tensor& vg, const Tensor& sink, const Tensor& out, const Tensor& lse) {
    constexpr std::string_view op = "attention_global_fwd";
    const GlobalParams p = make_params(q, kg, vg, sink, out, lse, op);
    if (q.numel() == 0) return;
    core::NvtxRange range("attention_global_fwd");
    MT_CUDA_DISPATCH(q.dtype(), T, global_fwd_kernel<T><<<row_blocks(p), kWarps * 32, 0, core::exec_stream()>>>(p));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(attention_global_fwd, cuda, attention_global_fwd, ::mt::ops::half_and_float_dtypes);

void attention_global_bwd(const Tensor& q,
                          const Tensor& kg,
                          const Tensor& vg,
                          const Tensor& sink,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& dout,
                          const Tensor& dq,
                          const Tensor& dkg,
                          const Tensor& dvg,
                          const Tensor& dsink) {
    constexpr std::string_view op = "attention_global_bwd";
    GlobalParams p = make_params(q, kg, vg, sink, out, lse, op);
    for (const NamedArg& a : {NamedArg{"dout", dout}, NamedArg{"dq", dq}, NamedArg{"dkg", dkg}, NamedArg{"dvg", dvg}})
        if (a.tensor.defined()) check_dtype_as(a.tensor, q, op, a.name, "q");
    if (dsink.defined()) check_dtype_in(dsink, {q.dtype(), DType::f32}, op, "dsink");
    if (q.numel() == 0) return;
    core::NvtxRange range("attention_global_bwd");
    p.dout = dout.raw();
    p.dq = dq.raw();
    core::Backend& be = core::backend_get(core::Device::cuda);
    const int64_t rows = p.tokens * p.hq;
    const size_t pg_bytes = static_cast<size_t>(rows * p.g) * sizeof(float);
    const size_t ps_bytes = p.sink != nullptr ? static_cast<size_t>(rows) * sizeof(float) : 0;
    p.p = pg_bytes > 0 ? static_cast<float*>(be.alloc_scratch(pg_bytes)) : nullptr;
    p.ds = pg_bytes > 0 ? static_cast<float*>(be.alloc_scratch(pg_bytes)) : nullptr;
    p.ps = ps_bytes > 0 ? static_cast<float*>(be.alloc_scratch(ps_bytes)) : nullptr;
    cudaStream_t stream = core::exec_stream();
    MT_CUDA_DISPATCH(q.dtype(), T, global_bwd_rows_kernel<T><<<row_blocks(p), kWarps * 32, 0, stream>>>(p));
    MT_CUDA_CHECK(cudaGetLastError());
    if (p.g > 0) {
        const int chunks = static_cast<int>((p.tokens + kChunk - 1) / kChunk), slots = p.g * p.hkv;
        const size_t partial_bytes = static_cast<size_t>(chunks) * slots * 2 * p.d * sizeof(float);
        auto* partial = static_cast<float*>(be.alloc_scratch(partial_bytes));
        MT_CUDA_DISPATCH(q.dtype(), T, {
            global_bwd_partial_kernel<T><<<dim3(chunks, slots), kSumThreads, 0, stream>>>(p, partial);
            MT_CUDA_CHECK(cudaGetLastError());
            global_bwd_reduce_kernel<T><<<slots, kSumThreads, 0, stream>>>(
                p, partial, chunks, static_cast<T*>(dkg.raw()), static_cast<T*>(dvg.raw()));
        });
        MT_CUDA_CHECK(cudaGetLastError());
        be.free(partial, partial_bytes);
    }
    if (p.sink != nullptr) {
        if (dsink.dtype() == DType::f32)
            global_bwd_sink_kernel<float><<<p.hq, kSumThreads, 0, stream>>>(p, dsink.data<float>());
        else
            MT_CUDA_DISPATCH(q.dtype(),
                             T,
                             global_bwd_sink_kernel<T>
                             <<<p.hq, kSumThreads, 0, stream>>>(p, static_cast<T*>(dsink.raw())));
        MT_CUDA_CHECK(cudaGetLastError());
    }
    if (pg_bytes > 0) {
        be.free(p.p, pg_bytes);
        be.free(p.ds, pg_bytes);
    }
    if (ps_bytes > 0) be.free(p.ps, ps_bytes);  // stream order keeps the reuse safe
}
MT_REGISTER_KERNEL(attention_global_bwd, cuda, attention_global_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
