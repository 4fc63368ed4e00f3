// CUDA RMSNorm, forward and backward, with f32 statistics and a deterministic weight gradient.
// Dtypes: x, y, dy, dx (and the fused add's residual and sum) bf16|f16|f32, all the dtype of x; weight bf16|f16|f32;
// rstd f32; dweight f32|bf16|f16 (f32 is the Megatron-style choice: the parameter gradient accumulates in f32 while
// activations are bf16). Forward: one block per row; sum(x^2) per thread in a fixed order, then a fixed-order block
// sum. Backward: block b handles rows [b kRows, b kRows + kRows) one after the other, writing dx and summing dy * xhat
// per column into an f32 shared-memory row (each column owned by one thread); the block writes that partial row to a
// scratch buffer, and a second kernel adds the partials to dweight in block order. No atomics, so dweight is the same
// on every run.
#include "ops/cuda/common.cuh"
#include "ops/registry.h"
#include "ops/rmsnorm.h"

namespace mt::ops::cuda {

namespace {

constexpr int kRows = 32;          // rows per block of the backward (one partial dweight row each)
constexpr int kReduceCols = 32;    // columns per block of the partial reduction
constexpr int kReduceStripes = 8;  // partial rows summed in parallel (then combined in stripe order)

int threads_for(int64_t c, bool vec) {
    const int64_t lanes = vec ? c / 8 : c;
    return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (lanes + 31) / 32 * 32)));
}

// With residual (and sum) non-null, the first pass writes h = x + residual, rounded to TX as add_fwd rounds it, to
// sum and the rest reads h there (each thread reads back only the elements it wrote): the fused residual add. x,
// residual and sum may alias (no __restrict__ on them).
template <int VEC, typename TX, typename TW>
__global__ void rmsnorm_fwd_kernel(const TX* x,
                                   const TW* __restrict__ weight,
                                   double eps,
                                   TX* __restrict__ y,
                                   float* __restrict__ rstd,
                                   int64_t n,
                                   int64_t c,
                                   const TX* residual,
                                   TX* sum) {
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const TX* xr = x + row * c;  // [c]
        TX* yr = y + row * c;        // [c]
        float sum_sq = 0.0f;
        for (int64_t j = static_cast<int64_t>(threadIdx.x) * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float v[VEC];
            load_vec<VEC>(xr + j, v);
            if (residual != nullptr) {
                float r[VEC];
                load_vec<VEC>(residual + row * c + j, r);
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[k] = to_f32(from_f32<TX>(v[k] + r[k]));
                store_vec<VEC>(sum + row * c + j, v);
            }
#pragma unroll
            for (int k = 0; k < VEC; ++k) sum_sq += v[k] * v[k];
        }
        if (residual != nullptr) xr = sum + row * c;
        sum_sq = block_sum(sum_sq, scratch);
        const float r = static_cast<float>(1.0 / sqrt(static_cast<double>(sum_sq) / static_cast<double>(c) + eps));
        if (threadIdx.x == 0) rstd[row] = r;
        for (int64_t j = static_cast<int64_t>(threadIdx.x) * VEC; j < c; j += static_cast<int64_t>(blockDim.x) * VEC) {
            float v[VEC], w[VEC];
            load_vec<VEC>(xr + j, v);
            load_vec<VEC>(weight + j, w);
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[k] = v[k] * r * w[k];
            store_vec<VEC>(yr + j, v);
        }
    }
}

// dx = rstd (dy w - x coef) (+ dresidual), coef = rstd^2 sum(dy w x) / c; partial[block, :] = sum over its rows
// of dy x rstd. dresidual may alias dx (each element is read before the same thread writes it): no __restrict__.
template <int VEC, typename TX, typename TW>
__global__ void rmsnorm_bwd_kernel(const TX* __restrict__ x,
                                   const TW* __restrict__ weight,
                                   const float* __restrict__ rstd,
                                   const TX* __restrict__ dy,
                                   const TX* dresidual,
                                   TX* dx,
                                   float* __restrict__ partial,
                                   int64_t n,
                                   int64_t c) {
    extern __shared__ float dw[];  // [c]
    __shared__ float scratch[32];
    const int64_t stride = static_cast<int64_t>(blockDim.x) * VEC, j0 = static_cast<int64_t>(threadIdx.x) * VEC;
    for (int64_t j = j0; j < c; j += stride)
#pragma unroll
        for (int k = 0; k < VEC; ++k) dw[j + k] = 0.0f;
    const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows, row_end = row0 + kRows < n ? row0 + kRows : n;
    for (int64_t row = row0; row < row_end; ++row) {
        const TX* xr = x + row * c;                                             // [c]
        const TX* dyr = dy + row * c;                                           // [c]
        TX* dxr = dx + row * c;                                                 // [c]
        const TX* dres = dresidual != nullptr ? dresidual + row * c : nullptr;  // [c]
        const float r = rstd[row];
        float dot = 0.0f;
        for (int64_t j = j0; j < c; j += stride) {
            float xv[VEC], gv[VEC], wv[VEC];
            load_vec<VEC>(xr + j, xv);
            load_vec<VEC>(dyr + j, gv);
            load_vec<VEC>(weight + j, wv);
#pragma unroll
            for (int k = 0; k < VEC; ++k) dot += gv[k] * wv[k] * xv[k];
        }
        dot = block_sum(dot, scratch);
        const float coef = dot * r * r / static_cast<float>(c);
        for (int64_t j = j0; j < c; j += stride) {
            float xv[VEC], gv[VEC], wv[VEC], out[VEC], rv[VEC] = {};
            load_vec<VEC>(xr + j, xv);
            load_vec<VEC>(dyr + j, gv);
            load_vec<VEC>(weight + j, wv);
            if (dres != nullptr) load_vec<VEC>(dres + j, rv);
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                out[k] = rv[k] + r * (gv[k] * wv[k] - xv[k] * coef);
                dw[j + k] += gv[k] * xv[k] * r;
            }
            store_vec<VEC>(dxr + j, out);
        }
    }
    float* pr = partial + static_cast<int64_t>(blockIdx.x) * c;  // [c]
    for (int64_t j = j0; j < c; j += stride)
#pragma unroll
        for (int k = 0; k < VEC; ++k) pr[j + k] = dw[j + k];
}

// dweight[j] += sum over b of partial[b, j]: stripe s sums b = s, s + 8, ... in order, then the stripes in order.
template <typename TG>
__global__ void rmsnorm_dweight_kernel(const float* __restrict__ partial,
                                       TG* __restrict__ dweight,
                                       int64_t blocks,
                                       int64_t c) {
    __shared__ float stripes[kReduceStripes][kReduceCols];
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kReduceCols + threadIdx.x;
    float sum = 0.0f;
    if (j < c)
        for (int64_t b = threadIdx.y; b < blocks; b += kReduceStripes) sum += partial[b * c + j];
    stripes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || j >= c) return;
    float total = 0.0f;
    for (int s = 0; s < kReduceStripes; ++s) total += stripes[s][threadIdx.x];
    dweight[j] = from_f32<TG>(to_f32(dweight[j]) + total);
}

}  // namespace

void rmsnorm_fwd(const Tensor& x,
                 const Tensor& weight,
                 double eps,
                 const Tensor& y,
                 const Tensor& rstd,
                 const Tensor& residual,
                 const Tensor& sum) {
    constexpr std::string_view op = "rmsnorm_fwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(weight, op, "weight");
    check_dtype_as(y, x, op, "y", "x");
    check_f32(rstd, op, "rstd");
    const int64_t n = x.size(0), c = x.size(1);
    if (n == 0) return;
    core::NvtxRange range(residual.defined() ? "add_rmsnorm_fwd" : "rmsnorm_fwd");
    const bool vec = vec_ok(c, {&x, &weight, &y, &residual, &sum});
    const int threads = threads_for(c, vec);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    MT_CUDA_DISPATCH(x.dtype(), TX, MT_CUDA_DISPATCH(weight.dtype(), TW, {
                         const TX* xp = static_cast<const TX*>(x.raw());
                         const TW* wp = static_cast<const TW*>(weight.raw());
                         TX* yp = static_cast<TX*>(y.raw());
                         const TX* rp = residual.defined() ? static_cast<const TX*>(residual.raw()) : nullptr;
                         TX* sp = sum.defined() ? static_cast<TX*>(sum.raw()) : nullptr;
                         if (vec)
                             rmsnorm_fwd_kernel<8, TX, TW><<<blocks, threads, 0, core::exec_stream()>>>(
                                 xp, wp, eps, yp, rstd.data<float>(), n, c, rp, sp);
                         else
                             rmsnorm_fwd_kernel<1, TX, TW><<<blocks, threads, 0, core::exec_stream()>>>(
                                 xp, wp, eps, yp, rstd.data<float>(), n, c, rp, sp);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(rmsnorm_fwd, cuda, rmsnorm_fwd, ::mt::ops::half_and_float_dtypes);

void rmsnorm_bwd(const Tensor& x,
                 const Tensor& weight,
                 const Tensor& rstd,
                 const Tensor& dy,
                 const Tensor& dx,
                 const Tensor& dweight,
                 const Tensor& dresidual) {
    constexpr std::string_view op = "rmsnorm_bwd";
    check_cuda_float(x, op, "x");
    check_cuda_float(weight, op, "weight");
    check_f32(rstd, op, "rstd");
    check_dtype_as(dy, x, op, "dy", "x");
    check_dtype_as(dx, x, op, "dx", "x");
    check_cuda_float(dweight, op, "dweight");
    if (dresidual.defined()) check_dtype_as(dresidual, x, op, "dresidual", "x");
    const int64_t n = x.size(0), c = x.size(1);
    if (n == 0) return;
    core::NvtxRange range("rmsnorm_bwd");
    const bool vec = vec_ok(c, {&x, &weight, &dy, &dx, &dresidual});
    const int threads = threads_for(c, vec);
    const int64_t blocks = (n + kRows - 1) / kRows;
    const Tensor partial = Tensor::scratch({blocks, c}, DType::f32, core::Device::cuda);  // [blocks, c], all written
    const size_t smem = static_cast<size_t>(c) * sizeof(float);
    MT_CUDA_DISPATCH(x.dtype(), TX, MT_CUDA_DISPATCH(weight.dtype(), TW, {
                         const TX* xp = static_cast<const TX*>(x.raw());
                         const TW* wp = static_cast<const TW*>(weight.raw());
                         const TX* dyp = static_cast<const TX*>(dy.raw());
                         TX* dxp = static_cast<TX*>(dx.raw());
                         const TX* dresp = dresidual.defined() ? static_cast<const TX*>(dresidual.raw()) : nullptr;
                         auto kernel = vec ? rmsnorm_bwd_kernel<8, TX, TW> : rmsnorm_bwd_kernel<1, TX, TW>;
                         MT_CUDA_CHECK(cudaFuncSetAttribute(
                             kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
                         kernel<<<static_cast<unsigned>(blocks), threads, smem, core::exec_stream()>>>(
                             xp, wp, rstd.data<float>(), dyp, dresp, dxp, partial.data<float>(), n, c);
                     }));
    MT_CUDA_CHECK(cudaGetLastError());
    const dim3 reduce_threads(kReduceCols, kReduceStripes);
    const unsigned reduce_blocks = static_cast<unsigned>((c + kReduceCols - 1) / kReduceCols);
    MT_CUDA_DISPATCH(dweight.dtype(), TG, {
        rmsnorm_dweight_kernel<TG><<<reduce_blocks, reduce_threads, 0, core::exec_stream()>>>(
            partial.data<float>(), static_cast<TG*>(dweight.raw()), blocks, c);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(rmsnorm_bwd, cuda, rmsnorm_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
