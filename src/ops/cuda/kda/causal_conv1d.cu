// CUDA causal depthwise conv with optional SiLU (ops/causal_conv1d.h): x, y, dy, dx bf16|f16|f32 (one dtype), w and
// dw bf16|f16|f32 each; f32 math. The op does a few flops per element, so the kernels are built to move each byte of
// x, dy, y and dx once: a thread owns kVec adjacent channels (a 2-element word where C and the pointers allow it, else
// one channel) and kRows consecutive tokens of one batch row, and walks them in order with the last kW inputs (and,
// backward, the last kW dz) in registers, loading kChunk tokens at a time so that many loads are in flight. The W - 1
// halo tokens on each side of a thread's span are read again by it (L2 hits: a neighbour reads them too), and the
// backward recomputes the pre-activations of its halo outputs rather than exchanging them.
// Backward: dz = dy silu'(z) once per position; dx[t] = sum_tau w[tau] dz[t + W - 1 - tau] from the dz window; dw
// summed in registers over the thread's tokens in order, then over the block's warps in warp order (shared memory)
// into one f32 partial row per block, which a second kernel adds to dw in block order: a fixed order, no atomics.
// Widths up to 4 run in a 4-tap window, 5 to 8 in an 8-tap one (one channel per thread); wider ones are refused.
// With a document-start map (ConvDims::doc_start) a token's taps stop at its document's start, and dx gathers only
// the outputs of its own document.
#include <type_traits>

#include "ops/causal_conv1d.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kLanes = 32;    // threads along channels: one warp reads kLanes * kVec adjacent channels of a token
constexpr int kWarps = 4;     // warps along time per block (their dw partials are summed in the block)
constexpr int kRows = 64;     // tokens per thread: the halo (2 (W - 1) inputs) costs ~10% extra reads, from L2
constexpr int kChunk = 8;     // tokens loaded together per thread (loads in flight before the first use)
constexpr int kMaxWidth = 8;  // widest W the kernels take (the 8-tap window)
constexpr int kBlockTokens = kWarps * kRows;

struct ConvDims {
    int64_t b, c;
    int t, w;                  // T < 2^31 - kBlockTokens (checked): token positions are ints
    const int32_t* doc_start;  // [B, T] or null (one document per row)
    int64_t tiles;             // time tiles of kBlockTokens tokens per batch row
    int64_t chan_blocks;       // channel spans of kLanes * kVec channels
};

// kVec adjacent elements of T in their storage form, moved by one load or store (two bf16 or f16 in one register).
template <typename T, int kVec>
struct Elems;
template <typename T>
struct Elems<T, 1> {
    T v;
    __device__ void to(float (&out)[1]) const {
        out[0] = to_f32(v);
    }
    __device__ static Elems from(const float (&in)[1]) {
        return {from_f32<T>(in[0])};
    }
};
template <typename T>
struct Elems<T, 2> {  // bf16, f16
    typename Pair<T>::type v;
    __device__ void to(float (&out)[2]) const {
        const float2 f = pair_to_f32(v);
        out[0] = f.x, out[1] = f.y;
    }
    __device__ static Elems from(const float (&in)[2]) {
        return {Pair<T>::from(in[0], in[1])};
    }
};
template <>
struct Elems<float, 2> {
    float2 v;
    __device__ void to(float (&out)[2]) const {
        out[0] = v.x, out[1] = v.y;
    }
    __device__ static Elems from(const float (&in)[2]) {
        return {make_float2(in[0], in[1])};
    }
};

// The thread's tokens [t0, t1) of one batch row and its first channel c0; at is the offset of (row, token 0, c0) in
// x, first its row of the document map (or null); tile is the block's time tile over all rows (its dw partial row).
// Active when it owns at least one token and one channel.
struct ThreadSpan {
    int t0, t1;
    int64_t c0, at, tile;
    const int32_t* first;
    bool active;
};

template <int kVec>
__device__ ThreadSpan thread_span(const ConvDims& d) {
    ThreadSpan s;
    const int64_t cb = blockIdx.x % d.chan_blocks;
    s.tile = blockIdx.x / d.chan_blocks;
    const int64_t bb = s.tile / d.tiles;
    s.t0 = static_cast<int>(s.tile % d.tiles) * kBlockTokens + static_cast<int>(threadIdx.y) * kRows;
    s.t1 = s.t0 + kRows < d.t ? s.t0 + kRows : d.t;
    s.c0 = (cb * kLanes + threadIdx.x) * kVec;
    s.at = bb * d.t * d.c + s.c0;
    s.first = d.doc_start != nullptr ? d.doc_start + bb * d.t : nullptr;
    s.active = s.t0 < d.t && s.c0 < d.c;
    return s;
}

// The elements at token s of the thread's row and channels, or zeros where `ok` is false.
template <int kVec, typename T>
__device__ __forceinline__ Elems<T, kVec> load_at(const T* p, const ConvDims& d, const ThreadSpan& sp, int s, bool ok) {
    Elems<T, kVec> e{};
    if (ok) e = *reinterpret_cast<const Elems<T, kVec>*>(p + sp.at + s * d.c);
    return e;
}

template <int kVec, typename T>
__device__ __forceinline__ void store_at(T* p, const ConvDims& d, const ThreadSpan& sp, int s, const float (&v)[kVec]) {
    *reinterpret_cast<Elems<T, kVec>*>(p + sp.at + s * d.c) = Elems<T, kVec>::from(v);
}

// The kChunk tokens from `base` into registers, those outside [lo, hi) as zeros: all the loads issue before any use.
template <int kVec, typename T>
__device__ __forceinline__ void load_chunk(
    const T* p, const ConvDims& d, const ThreadSpan& sp, int base, int lo, int hi, Elems<T, kVec> (&r)[kChunk]) {
#pragma unroll
    for (int u = 0; u < kChunk; ++u) r[u] = load_at<kVec>(p, d, sp, base + u, base + u >= lo && base + u < hi);
}

// The first input positions (documents' starts) of the kChunk tokens from `base`; 0 without a map or outside [lo, hi).
__device__ __forceinline__ void load_firsts(const ThreadSpan& sp, int base, int lo, int hi, int (&first)[kChunk]) {
#pragma unroll
    for (int u = 0; u < kChunk; ++u)
        first[u] = sp.first != nullptr && base + u >= lo && base + u < hi ? sp.first[base + u] : 0;
}

// Window slot j of token s holds x[s - kW + 1 + j]; tap tau of w sits in slot kW - W + tau. The first slot s reads:
// slots before kW - W are outside the width, and inputs before s's first input read zero.
template <int kW>
__device__ __forceinline__ int first_slot(const ConvDims& d, int s, int first) {
    const int back = s - first;  // inputs of s's document before s
    const int by_doc = back >= kW - 1 ? 0 : kW - 1 - back;
    return by_doc > kW - d.w ? by_doc : kW - d.w;
}

// wv[j][v] = w[c0 + v, tau] in slot j = kW - W + tau (zero in the slots before).
template <int kW, int kVec, typename TW>
__device__ __forceinline__ void load_taps(const TW* w, const ConvDims& d, int64_t c0, float (&wv)[kW][kVec]) {
#pragma unroll
    for (int j = 0; j < kW; ++j)
#pragma unroll
        for (int v = 0; v < kVec; ++v) wv[j][v] = j >= kW - d.w ? to_f32(w[(c0 + v) * d.w + j - (kW - d.w)]) : 0.0f;
}

// Shifts a window by one token: slot j takes slot j + 1, the last slot takes `in`.
template <int kW, int kVec, typename A>
__device__ __forceinline__ void push(A (&win)[kW][kVec], const A (&in)[kVec]) {
#pragma unroll
    for (int j = 0; j + 1 < kW; ++j)
#pragma unroll
        for (int v = 0; v < kVec; ++v) win[j][v] = win[j + 1][v];
#pragma unroll
    for (int v = 0; v < kVec; ++v) win[kW - 1][v] = in[v];
}

// Shifts the input window by one token, the last slot taking the token's elements.
template <int kW, int kVec, typename T>
__device__ __forceinline__ void push_input(float (&xw)[kW][kVec], const Elems<T, kVec>& e) {
    float v[kVec];
    e.to(v);
    push(xw, v);
}

// Pre-activation z = sum over the slots j >= j0 (taps in order) of w x.
template <int kW, int kVec>
__device__ __forceinline__ void pre_activation(const float (&xw)[kW][kVec],
                                               const float (&wv)[kW][kVec],
                                               int j0,
                                               float (&z)[kVec]) {
#pragma unroll
    for (int v = 0; v < kVec; ++v) z[v] = 0.0f;
#pragma unroll
    for (int j = 0; j < kW; ++j)
        if (j >= j0)
#pragma unroll
            for (int v = 0; v < kVec; ++v) z[v] += wv[j][v] * xw[j][v];
}

template <typename TX, typename TW, int kW, int kVec>
__global__ void __launch_bounds__(kLanes* kWarps)
    conv_fwd_kernel(const TX* __restrict__ x, const TW* __restrict__ w, TX* __restrict__ y, ConvDims d, bool silu) {
    const ThreadSpan sp = thread_span<kVec>(d);
    if (!sp.active) return;
    float wv[kW][kVec], xw[kW][kVec] = {};
    load_taps(w, d, sp.c0, wv);
    // Inputs from t0 - kW + 1 (the window of t0), outputs [t0, t1).
    for (int base = sp.t0 - (kW - 1); base < sp.t1; base += kChunk) {
        Elems<TX, kVec> xr[kChunk];
        int first[kChunk];
        load_chunk(x, d, sp, base, 0, sp.t1, xr);
        load_firsts(sp, base, sp.t0, sp.t1, first);
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
            push_input(xw, xr[u]);
            const int s = base + u;
            if (s < sp.t0 || s >= sp.t1) continue;
            float z[kVec];
            pre_activation(xw, wv, first_slot<kW>(d, s, first[u]), z);
#pragma unroll
            for (int v = 0; v < kVec; ++v) z[v] = silu ? z[v] * sigmoid_f32(z[v]) : z[v];
            store_at<kVec>(y, d, sp, s, z);
        }
    }
}

// One thread's backward walk: dz for the outputs [t0, t1 + kW - 1) (those past t1 are the halo its dx needs), dx
// written for [t0, t1), and the dw sums of the outputs [t0, t1) added to dwp (slots as wv).
template <typename TX, typename TW, int kW, int kVec>
__device__ __forceinline__ void conv_bwd_span(const TX* __restrict__ x,
                                              const TW* __restrict__ w,
                                              const TX* __restrict__ dy,
                                              TX* __restrict__ dx,
                                              const ConvDims& d,
                                              bool silu,
                                              const ThreadSpan& sp,
                                              float (&dwp)[kW][kVec]) {
    float wv[kW][kVec], xw[kW][kVec] = {}, dzw[kW][kVec] = {};
    int firstw[kW][1] = {};  // first inputs of the dz window's tokens (one column: push's shape)
    load_taps(w, d, sp.c0, wv);
    const int end = sp.t1 + kW - 1;  // dx[t] is complete once dz[t + kW - 1] is in the window
    for (int base = sp.t0 - (kW - 1); base < end; base += kChunk) {
        Elems<TX, kVec> xr[kChunk], dyr[kChunk];
        int first[kChunk];
        const int hi = end < d.t ? end : d.t;  // dy and the map only for the outputs whose dz the thread needs
        load_chunk(x, d, sp, base, 0, hi, xr);
        load_chunk(dy, d, sp, base, sp.t0, hi, dyr);
        load_firsts(sp, base, sp.t0, hi, first);
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
            push_input(xw, xr[u]);
            const int s = base + u;
            float dz[kVec];
            dyr[u].to(dz);  // zero outside the outputs
            if (s >= sp.t0 && s < d.t) {
                const int j0 = first_slot<kW>(d, s, first[u]);
                if (silu) {
                    float z[kVec];
                    pre_activation(xw, wv, j0, z);
#pragma unroll
                    for (int v = 0; v < kVec; ++v) {
                        const float sg = sigmoid_f32(z[v]);
                        dz[v] *= sg * (1.0f + z[v] * (1.0f - sg));
                    }
                }
                if (s < sp.t1) {
#pragma unroll
                    for (int j = 0; j < kW; ++j)
                        if (j >= j0)
#pragma unroll
                            for (int v = 0; v < kVec; ++v) dwp[j][v] += dz[v] * xw[j][v];
                }
            }
            push(dzw, dz);
            push(firstw, {first[u]});
            // dx[t], t = s - kW + 1: dzw[k] = dz[t + k] with w's tap W - 1 - k (slot kW - 1 - k), taps in order,
            // over the outputs inside T and t's document.
            const int t = s - (kW - 1);
            if (t < sp.t0 || t >= sp.t1) continue;
            float acc[kVec] = {};
#pragma unroll
            for (int k = kW - 1; k >= 0; --k) {
                if (k >= d.w || t + k >= d.t || firstw[k][0] > t) continue;
#pragma unroll
                for (int v = 0; v < kVec; ++v) acc[v] += wv[kW - 1 - k][v] * dzw[k][v];
            }
            store_at<kVec>(dx, d, sp, t, acc);
        }
    }
}

// dx, and partial[tile, ch, tau] = the block's dw sums: each thread's tokens in order, then the warps in order.
template <typename TX, typename TW, int kW, int kVec>
__global__ void __launch_bounds__(kLanes* kWarps, 4) conv_bwd_kernel(const TX* __restrict__ x,
                                                                     const TW* __restrict__ w,
                                                                     const TX* __restrict__ dy,
                                                                     TX* __restrict__ dx,
                                                                     float* __restrict__ partial,
                                                                     ConvDims d,
                                                                     bool silu) {
    __shared__ float sums[kWarps][kW][kLanes * kVec];
    const ThreadSpan sp = thread_span<kVec>(d);
    float dwp[kW][kVec] = {};
    if (sp.active) conv_bwd_span<TX, TW, kW, kVec>(x, w, dy, dx, d, silu, sp, dwp);
#pragma unroll
    for (int j = 0; j < kW; ++j)
#pragma unroll
        for (int v = 0; v < kVec; ++v) sums[threadIdx.y][j][threadIdx.x * kVec + v] = dwp[j][v];
    __syncthreads();
    if (threadIdx.y != 0 || sp.c0 >= d.c) return;
    float* pr = partial + (sp.tile * d.c + sp.c0) * d.w;
#pragma unroll
    for (int j = 0; j < kW; ++j) {
        if (j < kW - d.w) continue;
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
            float acc = 0.0f;
#pragma unroll
            for (int wy = 0; wy < kWarps; ++wy) acc += sums[wy][j][threadIdx.x * kVec + v];
            pr[v * d.w + j - (kW - d.w)] = acc;
        }
    }
}

// dw[j] += sum over the blocks, in block order, of partial[blk, j].
template <typename TG>
__global__ void conv_dw_reduce_kernel(const float* __restrict__ partial,
                                      TG* __restrict__ dw,
                                      int64_t blocks,
                                      int64_t cw) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < cw;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (int64_t blk = 0; blk < blocks; ++blk) acc += partial[blk * cw + j];
        dw[j] = from_f32<TG>(to_f32(dw[j]) + acc);
    }
}

// Channels per thread: 2 where C is even, the width fits the 4-tap window and every [B, T, C] tensor's pointer is
// aligned to 2 elements (views may start anywhere), else 1.
int conv_vec(int64_t c, int64_t width, std::initializer_list<const Tensor*> tensors) {
    if (c % 2 != 0 || width > 4) return 1;
    for (const Tensor* t : tensors)
        if (reinterpret_cast<uintptr_t>(t->raw()) % (2 * core::dtype_size(t->dtype())) != 0) return 1;
    return 2;
}

// The launch dimensions for x [B, T, C] and w [C, W] (W <= kMaxWidth, checked) with vec channels per thread.
ConvDims conv_dims(const Tensor& x, const Tensor& w, const Tensor& doc_start, int vec, std::string_view op) {
    MT_CHECK(w.size(1) <= kMaxWidth,
             "{}: w has width {} but the CUDA kernels take widths up to {}",
             op,
             w.size(1),
             kMaxWidth);
    MT_CHECK(x.size(1) < (int64_t{1} << 31) - kBlockTokens,
             "{}: x has shape {}; the CUDA kernels take T < 2^31 - {}",
             op,
             core::shape_str(x.shape()),
             kBlockTokens);
    ConvDims d{x.size(0), x.size(2), static_cast<int>(x.size(1)), static_cast<int>(w.size(1)), nullptr, 0, 0};
    d.doc_start = doc_start.defined() ? doc_start.data<int32_t>() : nullptr;  // checked by ops/causal_conv1d.cpp
    d.tiles = (d.t + kBlockTokens - 1) / kBlockTokens;
    d.chan_blocks = (d.c + kLanes * vec - 1) / (kLanes * vec);
    MT_CHECK(d.b * d.tiles * d.chan_blocks < (int64_t{1} << 31),
             "{}: x of shape {} needs more than 2^31 blocks",
             op,
             core::shape_str(x.shape()));
    return d;
}

// Calls launch(kW, kVec) as integral constants: the 4-tap window for widths up to 4 (vec channels per thread), the
// 8-tap one (one channel) above.
template <typename Launch>
void with_window(const ConvDims& d, int vec, const Launch& launch) {
    if (d.w > 4)
        launch(std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{});
    else if (vec == 2)
        launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 2>{});
    else
        launch(std::integral_constant<int, 4>{}, std::integral_constant<int, 1>{});
}

}  // namespace

void causal_conv1d_fwd(const Tensor& x, const Tensor& w, const Tensor& y, bool silu, const Tensor& doc_start) {
    constexpr std::string_view op = "causal_conv1d_fwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(w, op, "w");
    check_dtype_as(y, x, op, "y", "x");
    const int vec = conv_vec(x.size(2), w.size(1), {&x, &y});
    const ConvDims d = conv_dims(x, w, doc_start, vec, op);
    if (d.b * d.t * d.c == 0) return;
    core::NvtxRange range("causal_conv1d_fwd");
    const unsigned blocks = static_cast<unsigned>(d.b * d.tiles * d.chan_blocks);
    MT_CUDA_DISPATCH(
        x.dtype(), TX, MT_CUDA_DISPATCH(w.dtype(), TW, with_window(d, vec, [&](auto kw, auto kv) {
                                            conv_fwd_kernel<TX, TW, decltype(kw)::value, decltype(kv)::value>
                                                <<<blocks, dim3(kLanes, kWarps), 0, core::exec_stream()>>>(
                                                    static_cast<const TX*>(x.raw()),
                                                    static_cast<const TW*>(w.raw()),
                                                    static_cast<TX*>(y.raw()),
                                                    d,
                                                    silu);
                                        })));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(causal_conv1d_fwd, cuda, causal_conv1d_fwd, ::mt::ops::half_and_float_dtypes);

void causal_conv1d_bwd(const Tensor& x,
                       const Tensor& w,
                       const Tensor& dy,
                       const Tensor& dx,
                       const Tensor& dw,
                       bool silu,
                       const Tensor& doc_start) {
    constexpr std::string_view op = "causal_conv1d_bwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(w, op, "w");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_cuda_float(dw, op, "dw");
    const int vec = conv_vec(x.size(2), w.size(1), {&x, &dy, &dx});
    const ConvDims d = conv_dims(x, w, doc_start, vec, op);
    if (d.b * d.t * d.c == 0) return;
    core::NvtxRange range("causal_conv1d_bwd");
    const int64_t tiles = d.b * d.tiles, cw = d.c * d.w;
    const unsigned blocks = static_cast<unsigned>(tiles * d.chan_blocks);
    const Tensor partial = Tensor::scratch({tiles * cw}, DType::f32, core::Device::cuda);
    MT_CUDA_DISPATCH(
        x.dtype(), TX, MT_CUDA_DISPATCH(w.dtype(), TW, with_window(d, vec, [&](auto kw, auto kv) {
                                            conv_bwd_kernel<TX, TW, decltype(kw)::value, decltype(kv)::value>
                                                <<<blocks, dim3(kLanes, kWarps), 0, core::exec_stream()>>>(
                                                    static_cast<const TX*>(x.raw()),
                                                    static_cast<const TW*>(w.raw()),
                                                    static_cast<const TX*>(dy.raw()),
                                                    static_cast<TX*>(dx.raw()),
                                                    partial.data<float>(),
                                                    d,
                                                    silu);
                                        })));
    MT_CUDA_CHECK(cudaGetLastError());
    MT_CUDA_DISPATCH(dw.dtype(), TG, {
        conv_dw_reduce_kernel<TG><<<grid_for(cw, 256), 256, 0, core::exec_stream()>>>(
            partial.data<float>(), static_cast<TG*>(dw.raw()), tiles, cw);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(causal_conv1d_bwd, cuda, causal_conv1d_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
