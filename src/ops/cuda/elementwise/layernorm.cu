// CUDA LayerNorm, forward and backward, with f32 statistics and deterministic weight and bias gradients (the scheme of
// rmsnorm.cu). Dtypes: x, y, dy, dx, dresidual bf16|f16|f32, all the dtype of x; weight and bias bf16|f16|f32, one
// dtype; mean and rstd f32; dweight and dbias f32|bf16|f16, one dtype. Forward: one block per row; the row sum and then
// the centred sum of squares, each per thread in a fixed order and then a fixed-order block sum. Backward: block b
// handles rows [b kRows, b kRows + kRows) one after the other, writing dx and summing dy * xhat and dy per column into
// two f32 shared-memory rows (each column owned by one thread); the block writes them to a scratch buffer, and a
// second kernel adds the partials to dweight and dbias in block order. No atomics, so the gradients are the same on
// every run.
#include "ops/cuda/common.cuh"
#include "ops/layernorm.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kRows = 32;                // rows per block of the backward (one partial dweight and dbias row each)
constexpr int kReduceCols = 32;          // columns per block of the partial reduction
constexpr int kReduceStripes = 8;        // partial rows summed in parallel (then combined in stripe order)
constexpr size_t kMaxSmem = 200 * 1024;  // the backward's two f32 rows of C must fit (H100: 227 KB per block)

int threads_for(int64_t c, bool vec) {
    const int64_t lanes = vec ? c / 8 : c;
    return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (lanes + 31) / 32 * 32)));
}

template <int VEC, typename TX, typename TW>
__global__ void layernorm_fwd_kernel(const TX* __restrict__ x,
                                     const TW* __restrict__ weight,
                                     const TW* __restrict__ bias,
                                     double eps,
                                     TX* __restrict__ y,
                                     float* __restrict__ mean,
                                     float* __restrict__ rstd,
                                     int64_t n,
                                     int64_t c) {
    __shared__ float scratch[32];
    const int64_t stride = static_cast<int64_t>(blockDim.x) * VEC, j0 = static_cast<int64_t>(threadIdx.x) * VEC;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const TX* xr = x + row * c;  // [c]
        TX* yr = y + row * c;        // [c]
        float sum = 0.0f;
        for (int64_t j = j0; j < c; j += stride) {
            float v[VEC];
            load_vec<VEC>(xr + j, v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) sum += v[k];
        }
        const float mu = block_sum(sum, scratch) / static_cast<float>(c);
        float sum_sq = 0.0f;
        for (int64_t j = j0; j < c; j += stride) {
            float v[VEC];
            load_vec<VEC>(xr + j, v);
#pragma unroll
            for (int k = 0; k < VEC; ++k) sum_sq += (v[k] - mu) * (v[k] - mu);
        }
        sum_sq = block_sum(sum_sq, scratch);
        const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(sum_sq) / static_cast<double>(c) + eps));
        if (threadIdx.x == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
        for (int64_t j = j0; j < c; j += stride) {
            float v[VEC], w[VEC], b[VEC];
            load_vec<VEC>(xr + j, v);
            load_vec<VEC>(weight + j, w);
            load_vec<VEC>(bias + j, b);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = (v[k] - mu) * r * w[k] + b[k];
            store_vec<VEC>(yr + j, v);
        }
    }
}

// dx = rstd (dy w - mean(dy w) - xhat mean(dy w xhat)) (+ dresidual), xhat = (x - mean) rstd;
// partial[block, 0, :] = sum over its rows of dy xhat, partial[block, 1, :] = sum of dy. dresidual may alias dx (each
// element is read before the same thread writes it): no __restrict__.
template <int VEC, typename TX, typename TW>
__global__ void layernorm_bwd_kernel(const TX* __restrict__ x,
                                     const TW* __restrict__ weight,
                                     const float* __restrict__ mean,
                                     const float* __restrict__ rstd,
                                     const TX* __restrict__ dy,
                                     const TX* dresidual,
                                     TX* dx,
                                     float* __restrict__ partial,
                                     int64_t n,
                                     int64_t c) {
    extern __shared__ float smem[];  // [2, c]: dweight, dbias of this block's rows
    float* dw = smem;
    float* db = smem + c;
    __shared__ float scratch[32];
    const int64_t stride = static_cast<int64_t>(blockDim.x) * VEC, j0 = static_cast<int64_t>(threadIdx.x) * VEC;
    for (int64_t j = j0; j < c; j += stride)
#pragma unroll
        for (int k = 0; k < VEC; ++k) dw[j + k] = db[j + k] = 0.0f;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows, row_end = row0 + kRows < n ? row0 + kRows : n;
    for (int64_t row = row0; row < row_end; ++row) {
        const TX* xr = x + row * c;                                             // [c]
        const TX* dyr = dy + row * c;                                           // [c]
        TX* dxr = dx + row * c;                                                 // [c]
        const TX* dres = dresidual != nullptr ? dresidual + row * c : nullptr;  // [c]
        const float mu = mean[row], r = rstd[row];
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int64_t j = j0; j < c; j += stride) {
            float xv[VEC], gv[VEC], wv[VEC];
            load_vec<VEC>(xr + j, xv);
            load_vec<VEC>(dyr + j, gv);
            load_vec<VEC>(weight + j, wv);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                // __fmul_rn: no FMA contraction here or below, so both passes see the same rounded g (a contracted
                // g - mean_g would keep the product's rounding error, which rstd then scales: nonzero dx at C = 1).
                const float g = __fmul_rn(gv[k], wv[k]);
                sum_g += g;
                sum_gx += g * (xv[k] - mu) * r;
            }
        }
        const float mean_g = block_sum(sum_g, scratch) / static_cast<float>(c);
        const float mean_gx = block_sum(sum_gx, scratch) / static_cast<float>(c);
        for (int64_t j = j0; j < c; j += stride) {
            float xv[VEC], gv[VEC], wv[VEC], out[VEC], rv[VEC] = {};
            load_vec<VEC>(xr + j, xv);
            load_vec<VEC>(dyr + j, gv);
            load_vec<VEC>(weight + j, wv);
            if (dres != nullptr) load_vec<VEC>(dres + j, rv);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const float xhat = (xv[k] - mu) * r;
                out[k] = rv[k] + r * (__fmul_rn(gv[k], wv[k]) - mean_g - xhat * mean_gx);
                dw[j + k] += gv[k] * xhat;
                db[j + k] += gv[k];
            }
            store_vec<VEC>(dxr + j, out);
        }
    }
    float* pr = partial + static_cast<int64_t>(blockIdx.x) * 2 * c;  // [2, c]
    for (int64_t j = j0; j < c; j += stride)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            pr[j + k] = dw[j + k];
            pr[c + j + k] = db[j + k];
        }
}

// dweight[j] += sum over b of partial[b, 0, j] and dbias[j] += sum over b of partial[b, 1, j]: stripe s sums
// b = s, s + 8, ... in order, then the stripes in order. blockIdx.y picks dweight (0) or dbias (1).
template <typename TG>
__global__ void layernorm_dparam_kernel(
    const float* __restrict__ partial, TG* __restrict__ dweight, TG* __restrict__ dbias, int64_t blocks, int64_t c) {
    __shared__ float stripes[kReduceStripes][kReduceCols];
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kReduceCols + threadIdx.x;
    const int64_t which = blockIdx.y;  // 0: dweight, 1: dbias
    float sum = 0.0f;
    if (j < c)
        for (int64_t b = threadIdx.y; b < blocks; b += kReduceStripes) sum += partial[(b * 2 + which) * c + j];
    stripes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || j >= c) return;
    float total = 0.0f;
    for (int s = 0; s < kReduceStripes; ++s) total += stripes[s][threadIdx.x];
    TG* out = which == 0 ? dweight : dbias;
    out[j] = from_f32<TG>(to_f32(out[j]) + total);
}

}  // namespace

void layernorm_fwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& bias,
                   double eps,
                   const Tensor& y,
                   const Tensor& mean,
                   const Tensor& rstd) {
    constexpr std::string_view op = "layernorm_fwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(weight, op, "weight");
    check_dtype_as(bias, weight, op, "bias", "weight");
    check_dtype_as(y, x, op, "y", "x");
    check_f32(mean, op, "mean");
    check_f32(rstd, op, "rstd");
    const int64_t n = x.size(0), c = x.size(1);
    if (n == 0) return;
    core::NvtxRange range("layernorm_fwd");
    const bool vec = vec_ok(c, {&x, &weight, &bias, &y});
    const int threads = threads_for(c, vec);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    MT_CUDA_DISPATCH(x.dtype(), TX, MT_CUDA_DISPATCH(weight.dtype(), TW, {
                         const TX* xp = static_cast<const TX*>(x.raw());
                         const TW* wp = static_cast<const TW*>(weight.raw());
                         const TW* bp = static_cast<const TW*>(bias.raw());
                         TX* yp = static_cast<TX*>(y.raw());
                         auto kernel = vec ? layernorm_fwd_kernel<8, TX, TW> : layernorm_fwd_kernel<1, TX, TW>;
                         kernel<<<blocks, threads, 0, core::exec_stream()>>>(
                             xp, wp, bp, eps, yp, mean.data<float>(), rstd.data<float>(), n, c);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(layernorm_fwd, cuda, layernorm_fwd, ::mt::ops::half_and_float_dtypes);

void layernorm_bwd(const Tensor& x,
                   const Tensor& weight,
                   const Tensor& mean,
                   const Tensor& rstd,
                   const Tensor& dy,
                   const Tensor& dx,
                   const Tensor& dweight,
                   const Tensor& dbias,
                   const Tensor& dresidual) {
    constexpr std::string_view op = "layernorm_bwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(weight, op, "weight");
    check_f32(mean, op, "mean");
    check_f32(rstd, op, "rstd");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_cuda_float(dweight, op, "dweight");
    check_dtype_as(dbias, dweight, op, "dbias", "dweight");
    if (dresidual.defined()) check_dtype_as(dresidual, x, op, "dresidual", "x");
    const int64_t n = x.size(0), c = x.size(1);
    const size_t smem = static_cast<size_t>(2 * c) * sizeof(float);
    MT_CHECK(smem <= kMaxSmem,
             "{}: C = {} needs {} bytes of shared memory for the weight and bias gradient rows, more than the kernel's "
             "{}",
             op,
             c,
             smem,
             kMaxSmem);
    if (n == 0) return;
    core::NvtxRange range("layernorm_bwd");
    const bool vec = vec_ok(c, {&x, &weight, &dy, &dx, &dresidual});
    const int threads = threads_for(c, vec);
    const int64_t blocks = (n + kRows - 1) / kRows;
    // [blocks, 2, c], all written
    const Tensor partial = Tensor::scratch({blocks, 2, c}, DType::f32, core::Device::cuda);
    MT_CUDA_DISPATCH(
        x.dtype(), TX, MT_CUDA_DISPATCH(weight.dtype(), TW, {
            const TX* xp = static_cast<const TX*>(x.raw());
            const TW* wp = static_cast<const TW*>(weight.raw());
            const TX* dyp = static_cast<const TX*>(dy.raw());
            TX* dxp = static_cast<TX*>(dx.raw());
            const TX* dresp = dresidual.defined() ? static_cast<const TX*>(dresidual.raw()) : nullptr;
            auto kernel = vec ? layernorm_bwd_kernel<8, TX, TW> : layernorm_bwd_kernel<1, TX, TW>;
            MT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
            kernel<<<static_cast<unsigned>(blocks), threads, smem, core::exec_stream()>>>(
                xp, wp, mean.data<float>(), rstd.data<float>(), dyp, dresp, dxp, partial.data<float>(), n, c);
        }));
    MT_CUDA_CHECK(cudaGetLastError());
    const dim3 reduce_threads(kReduceCols, kReduceStripes);
    const dim3 reduce_blocks(static_cast<unsigned>((c + kReduceCols - 1) / kReduceCols), 2);
    MT_CUDA_DISPATCH(dweight.dtype(), TG, {
        layernorm_dparam_kernel<TG><<<reduce_blocks, reduce_threads, 0, core::exec_stream()>>>(
            partial.data<float>(), static_cast<TG*>(dweight.raw()), static_cast<TG*>(dbias.raw()), blocks, c);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(layernorm_bwd, cuda, layernorm_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
