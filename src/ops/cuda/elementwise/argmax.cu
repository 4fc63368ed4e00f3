// CUDA row-wise argmax (ops/argmax.h): one block per row, each thread scanning a strided slice and keeping its first
// maximum, then a warp and a block reduction that prefers the larger value and, between equal values, the smaller
// column. The result is the CPU reference's exactly (the order of the comparisons cannot change which column wins).
#include <climits>

#include "ops/argmax.h"
#include "ops/cuda/common.cuh"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace {

constexpr int kThreads = 256;

// Whether candidate (v, j) beats (best, at): larger, or equal and earlier. at = INT_MAX marks "nothing yet", which any
// candidate beats only by value (NaN and -inf never do), as the CPU's strict > from -inf.
__device__ __forceinline__ bool beats(float v, int j, float best, int at) {
    return v > best || (v == best && j < at && at != INT_MAX);
}

template <typename T>
__global__ void argmax_rows_kernel(const T* __restrict__ x, int32_t* __restrict__ out, int64_t n, int64_t v) {
    __shared__ float shared_v[32];
    __shared__ int shared_j[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T* r = x + row * v;
        float best = -INFINITY;
        int at = INT_MAX;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
            const float e = to_f32(r[j]);
            if (e > best) {  // j grows, so the first maximum of this thread's slice stays
                best = e;
                at = static_cast<int>(j);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float b2 = __shfl_xor_sync(0xffffffffu, best, o);
            const int a2 = __shfl_xor_sync(0xffffffffu, at, o);
            if (a2 != INT_MAX && (at == INT_MAX || beats(b2, a2, best, at))) {
                best = b2;
                at = a2;
            }
        }
        __syncthreads();  // the shared slots may still be read for the previous row
        if (lane == 0) {
            shared_v[warp] = best;
            shared_j[warp] = at;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float b = shared_v[0];
            int a = shared_j[0];
            for (int w = 1; w < warps; ++w)
                if (shared_j[w] != INT_MAX && (a == INT_MAX || beats(shared_v[w], shared_j[w], b, a))) {
                    b = shared_v[w];
                    a = shared_j[w];
                }
            out[row] = a == INT_MAX ? 0 : a;
        }
    }
}

}  // namespace

void argmax_rows(const Tensor& x, const Tensor& out) {
    constexpr std::string_view op = "argmax_rows";
    check_cuda_float(x, op, "x");
    const int64_t n = x.size(0), v = x.size(1);
    MT_CHECK(v <= INT_MAX, "{}: rows of {} columns exceed the i32 output", op, v);
    if (n == 0) return;
    core::NvtxRange range("argmax_rows");
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 1 << 20));
    MT_CUDA_DISPATCH(x.dtype(), T, {
        argmax_rows_kernel<T>
            <<<blocks, kThreads, 0, core::exec_stream()>>>(static_cast<const T*>(x.raw()), out.data<int32_t>(), n, v);
    });
    MT_CUDA_CHECK(cudaGetLastError());
}
MT_REGISTER_KERNEL(argmax_rows, cuda, argmax_rows, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
