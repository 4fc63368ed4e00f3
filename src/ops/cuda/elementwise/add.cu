// CUDA residual add and its accumulating backward, elementwise over flat buffers (deterministic).
// Dtypes: each of a, b, out, and each of dout, da, db, is bf16|f16|f32 on its own (a bf16 branch may add into an f32
// residual stream, and a bf16 gradient into f32 accumulators); the sum is formed in f32 and rounded once. out may
// alias a or b.
#include "ops/add.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

template <int VEC, typename TA, typename TB, typename TO>
__global__ void add_fwd_kernel(const TA* a, const TB* b, TO* out, int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float x[VEC], y[VEC];
        load_vec<VEC>(a + k, x);
        load_vec<VEC>(b + k, y);
#pragma unroll
        for (int v = 0; v < VEC; ++v) x[v] += y[v];
        store_vec<VEC>(out + k, x);
    }
}

template <int VEC, typename TD, typename TA, typename TB>
__global__ void add_bwd_kernel(const TD* __restrict__ dout, TA* __restrict__ da, TB* __restrict__ db, int64_t n) {
    for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < n;
         k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
        float d[VEC], x[VEC], y[VEC];
        load_vec<VEC>(dout + k, d);
        load_vec<VEC>(da + k, x);
        load_vec<VEC>(db + k, y);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            x[v] += d[v];
            y[v] += d[v];
        }
        store_vec<VEC>(da + k, x);
        store_vec<VEC>(db + k, y);
    }
}

}  // namespace

void add_fwd(const Tensor& a, const Tensor& b, const Tensor& out) {
    constexpr std::string_view op = "add_fwd";
    check_cuda_float(a, op, "a");
    check_cuda_float(b, op, "b");
    check_cuda_float(out, op, "out");
    const int64_t n = a.numel();
    if (n == 0) return;
    core::NvtxRange range("add_fwd");
    const bool vec = vec_ok(n, {&a, &b, &out});
    MT_CUDA_DISPATCH(
        a.dtype(),
        TA,
        MT_CUDA_DISPATCH(b.dtype(), TB, MT_CUDA_DISPATCH(out.dtype(), TO, {
                             const TA* ap = static_cast<const TA*>(a.raw());
                             const TB* bp = static_cast<const TB*>(b.raw());
                             TO* op_ = static_cast<TO*>(out.raw());
                             if (vec)
                                 add_fwd_kernel<8, TA, TB, TO>
                                     <<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(ap, bp, op_, n);
                             else
                                 add_fwd_kernel<1, TA, TB, TO>
                                     <<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(ap, bp, op_, n);
                         })));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(add_fwd, cuda, add_fwd, ::mt::ops::half_and_float_dtypes);

void add_bwd(const Tensor& dout, const Tensor& da, const Tensor& db) {
    constexpr std::string_view op = "add_bwd";
    check_cuda_float(dout, op, "dout");
    check_cuda_float(da, op, "da");
    check_cuda_float(db, op, "db");
    const int64_t n = dout.numel();
    if (n == 0) return;
    core::NvtxRange range("add_bwd");
    const bool vec = vec_ok(n, {&dout, &da, &db});
    MT_CUDA_DISPATCH(
        dout.dtype(),
        TD,
        MT_CUDA_DISPATCH(da.dtype(), TA, MT_CUDA_DISPATCH(db.dtype(), TB, {
                             const TD* dp = static_cast<const TD*>(dout.raw());
                             TA* ap = static_cast<TA*>(da.raw());
                             TB* bp = static_cast<TB*>(db.raw());
                             if (vec)
                                 add_bwd_kernel<8, TD, TA, TB>
                                     <<<grid_for(n / 8, kThreads), kThreads, 0, core::exec_stream()>>>(dp, ap, bp, n);
                             else
                                 add_bwd_kernel<1, TD, TA, TB>
                                     <<<grid_for(n, kThreads), kThreads, 0, core::exec_stream()>>>(dp, ap, bp, n);
                         })));
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(add_bwd, cuda, add_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
