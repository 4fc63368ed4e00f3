// CUDA causal depthwise conv with optional SiLU (ops/causal_conv1d.h): x, y, dy, dx bf16|f16|f32 (one dtype), w and
// dw bf16|f16|f32 each; f32 math. Forward and dx: one thread per element (dx gathers the W outputs its input feeds,
// recomputing their pre-activations). dw: each block sums dz x over its rows (kRows flattened (b, t) rows) per
// channel in row order into an f32 partial row, and a second kernel adds the partials to dw in block order; no
// atomics. With a document-start map (ConvDims::doc_start) a token's taps stop at its document's start, and dx
// gathers only the outputs of its own document.
#include "ops/causal_conv1d.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kRows = 256;  // rows per dw partial
constexpr int kThreads = 128;

struct ConvDims {
    int64_t b, t, c, w;
    const int32_t* doc_start;  // [B, T] or null (one document per row)
};

// The first input position token (bb, t) reads: its document's start (0 without a map).
__device__ __forceinline__ int64_t first_input(const ConvDims& d, int64_t bb, int64_t t) {
    return d.doc_start != nullptr ? d.doc_start[bb * d.t + t] : 0;
}

// The first tap of token (bb, t): inputs before its first input position read zero.
__device__ __forceinline__ int64_t first_tap(const ConvDims& d, int64_t bb, int64_t t) {
    const int64_t tau = d.w - 1 - (t - first_input(d, bb, t));
    return tau > 0 ? tau : 0;
}

// Pre-activation at (bb, t, ch): sum over tau >= first_tap of w[ch, tau] x[bb, t - W + 1 + tau, ch].
template <typename TX, typename TW>
__device__ __forceinline__ float conv_at(
    const TX* x, const TW* w, const ConvDims& d, int64_t bb, int64_t t, int64_t ch) {
    float z = 0.0f;
    for (int64_t tau = first_tap(d, bb, t); tau < d.w; ++tau)
        z += to_f32(w[ch * d.w + tau]) * to_f32(x[(bb * d.t + t - d.w + 1 + tau) * d.c + ch]);
    return z;
}

// dz = dy * silu'(z) (or dy), at (bb, t, ch).
template <typename TX, typename TW>
__device__ __forceinline__ float dz_at(
    const TX* x, const TW* w, const TX* dy, const ConvDims& d, int64_t bb, int64_t t, int64_t ch, bool silu) {
    float dz = to_f32(dy[(bb * d.t + t) * d.c + ch]);
    if (silu) {
        const float z = conv_at(x, w, d, bb, t, ch), s = sigmoid_f32(z);
        dz *= s * (1.0f + z * (1.0f - s));
    }
    return dz;
}

template <typename TX, typename TW>
__global__ void conv_fwd_kernel(
    const TX* __restrict__ x, const TW* __restrict__ w, TX* __restrict__ y, ConvDims d, bool silu) {
    const int64_t total = d.b * d.t * d.c;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t ch = i % d.c, bt = i / d.c, t = bt % d.t, bb = bt / d.t;
        const float z = conv_at(x, w, d, bb, t, ch);
        y[i] = from_f32<TX>(silu ? z * sigmoid_f32(z) : z);
    }
}

// dx[t] = sum over tau of w[tau] dz[t + W - 1 - tau] (outputs inside [t, T) of t's document).
template <typename TX, typename TW>
__global__ void conv_dx_kernel(const TX* __restrict__ x,
                               const TW* __restrict__ w,
                               const TX* __restrict__ dy,
                               TX* __restrict__ dx,
                               ConvDims d,
                               bool silu) {
    const int64_t total = d.b * d.t * d.c;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t ch = i % d.c, bt = i / d.c, t = bt % d.t, bb = bt / d.t;
        float acc = 0.0f;
        for (int64_t tau = 0; tau < d.w; ++tau) {
            const int64_t s = t + d.w - 1 - tau;
            if (s >= d.t || first_input(d, bb, s) > t) continue;
            acc += to_f32(w[ch * d.w + tau]) * dz_at(x, w, dy, d, bb, s, ch, silu);
        }
        dx[i] = from_f32<TX>(acc);
    }
}

// partial[blk, ch, tau] = sum over the block's rows r = (bb, t) of dz[r, ch] x[bb, t - W + 1 + tau, ch], rows in order.
template <typename TX, typename TW>
__global__ void conv_dw_partial_kernel(const TX* __restrict__ x,
                                       const TW* __restrict__ w,
                                       const TX* __restrict__ dy,
                                       float* __restrict__ partial,
                                       ConvDims d,
                                       bool silu) {
    const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (ch >= d.c) return;
    const int64_t rows = d.b * d.t, r0 = static_cast<int64_t>(blockIdx.y) * kRows;
    const int64_t r1 = r0 + kRows < rows ? r0 + kRows : rows;
    float* pr = partial + (static_cast<int64_t>(blockIdx.y) * d.c + ch) * d.w;
    for (int64_t tau = 0; tau < d.w; ++tau) pr[tau] = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r % d.t, bb = r / d.t;
        const float dz = dz_at(x, w, dy, d, bb, t, ch, silu);
        for (int64_t tau = first_tap(d, bb, t); tau < d.w; ++tau)
            pr[tau] += dz * to_f32(x[(bb * d.t + t - d.w + 1 + tau) * d.c + ch]);
    }
}

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

// The map's device pointer (ops/causal_conv1d.cpp checked it), or null.
const int32_t* doc_map(const Tensor& doc_start) {
    return doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
}

}  // namespace

void causal_conv1d_fwd(const Tensor& x, const Tensor& w, const Tensor& y, bool silu, const Tensor& doc_start) {
    constexpr std::string_view op = "causal_conv1d_fwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(w, op, "w");
    check_dtype_as(y, x, op, "y", "x");
    const ConvDims d{x.size(0), x.size(1), x.size(2), w.size(1), doc_map(doc_start)};
    const int64_t total = d.b * d.t * d.c;
    if (total == 0) return;
    core::NvtxRange range("causal_conv1d_fwd");
    MT_CUDA_DISPATCH(
        x.dtype(), TX, MT_CUDA_DISPATCH(w.dtype(), TW, {
            conv_fwd_kernel<TX, TW><<<grid_for(total, 256), 256, 0, core::exec_stream()>>>(
                static_cast<const TX*>(x.raw()), static_cast<const TW*>(w.raw()), static_cast<TX*>(y.raw()), d, silu);
        }));
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
    const ConvDims d{x.size(0), x.size(1), x.size(2), w.size(1), doc_map(doc_start)};
    const int64_t total = d.b * d.t * d.c;
    if (total == 0) return;
    core::NvtxRange range("causal_conv1d_bwd");
    const int64_t blocks = (d.b * d.t + kRows - 1) / kRows;
    MT_CHECK(blocks < 65536, "{}: B * T = {} is too large for the dw partial grid", op, d.b * d.t);
    const Tensor partial = Tensor::scratch({blocks * d.c * d.w}, DType::f32, core::Device::cuda);
    const dim3 grid(static_cast<unsigned>((d.c + kThreads - 1) / kThreads), static_cast<unsigned>(blocks));
    MT_CUDA_DISPATCH(x.dtype(), TX, MT_CUDA_DISPATCH(w.dtype(), TW, {
                         const TX* xp = static_cast<const TX*>(x.raw());
                         const TW* wp = static_cast<const TW*>(w.raw());
                         const TX* dyp = static_cast<const TX*>(dy.raw());
                         conv_dx_kernel<TX, TW><<<grid_for(total, 256), 256, 0, core::exec_stream()>>>(
                             xp, wp, dyp, static_cast<TX*>(dx.raw()), d, silu);
                         conv_dw_partial_kernel<TX, TW>
                             <<<grid, kThreads, 0, core::exec_stream()>>>(xp, wp, dyp, partial.data<float>(), d, silu);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    const int64_t cw = d.c * d.w;
    MT_CUDA_DISPATCH(dw.dtype(), TG, {
        conv_dw_reduce_kernel<TG><<<grid_for(cw, 256), 256, 0, core::exec_stream()>>>(
            partial.data<float>(), static_cast<TG*>(dw.raw()), blocks, cw);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(causal_conv1d_bwd, cuda, causal_conv1d_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
