// Shared helpers of the CUDA ops: 8-wide vector loads and stores of bf16/f16/f32 elements with f32 math (the element
// conversions are in prim/convert.cuh), deterministic (fixed-order) block reductions, the float-dtype dispatch and
// launch checks.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/prim/convert.cuh"
#include "ops/cuda/prim/math.cuh"
#include "ops/cuda/prim/warp.cuh"
#include "ops/op_common.h"

namespace mt::ops::cuda {

// VEC consecutive elements (VEC = 1 or 8) as f32. With VEC = 8 the pointer must be 16-byte aligned (bf16, f16) or
// 32-byte aligned (f32); vec_ok checks that on the host.
template <int VEC, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
    if constexpr (VEC == 8 && sizeof(T) == 2) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const auto* h = reinterpret_cast<const typename Pair<T>::type*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 f = pair_to_f32(h[k]);
            out[2 * k] = f.x;
            out[2 * k + 1] = f.y;
        }
    } else if constexpr (VEC == 8 && sizeof(T) == 4) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) out[k] = to_f32(p[k]);
    }
}

template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
    if constexpr (VEC == 8 && sizeof(T) == 2) {
        uint4 raw;
        auto* h = reinterpret_cast<typename Pair<T>::type*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = Pair<T>::from(in[2 * k], in[2 * k + 1]);
        *reinterpret_cast<uint4*>(p) = raw;
    } else if constexpr (VEC == 8 && sizeof(T) == 4) {
        reinterpret_cast<float4*>(p)[0] = make_float4(in[0], in[1], in[2], in[3]);
        reinterpret_cast<float4*>(p)[1] = make_float4(in[4], in[5], in[6], in[7]);
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = from_f32<T>(in[k]);
    }
}

// Sum over the block in a fixed order (a warp butterfly, then the warp sums in warp order), so the result is the
// same on every run. Every thread of the block must call it; all get the sum. `scratch` holds 32 values.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A total = 0;
    for (int w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

// Host side: whether every pointer allows 8-wide access of its element type and n is a multiple of 8.
inline bool vec_ok(int64_t n, std::initializer_list<const Tensor*> tensors) {
    if (n % 8 != 0) return false;
    for (const Tensor* t : tensors) {
        if (!t->defined()) continue;
        const size_t align = 8 * core::dtype_size(t->dtype());
        if (reinterpret_cast<uintptr_t>(t->raw()) % align != 0) return false;
    }
    return true;
}

// Blocks for a grid-stride elementwise kernel over `work` items with `threads` per block.
inline unsigned grid_for(int64_t work, int threads) {
    const int64_t blocks = (work + threads - 1) / threads;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// Fails unless t is bf16, f16 or f32 (the float dtypes of the CUDA ops). (Two tensors of one dtype:
// ops::check_dtype_as, shared with the CPU references.)
inline void check_cuda_float(const Tensor& t, std::string_view op, std::string_view arg) {
    check_dtype_in(t, {DType::bf16, DType::f16, DType::f32}, op, arg);
}
inline void check_f32(const Tensor& t, std::string_view op, std::string_view arg) {
    check_dtype_in(t, {DType::f32}, op, arg);
}

// Records the first out-of-range position of an index input (embedding ids, cross-entropy targets) on the device:
// kernels call note(i) for a bad position i, which keeps max(n - i) by an integer atomic (the same result in any
// order), so first_bad() finds the smallest bad position. first_bad() copies one int back, so it synchronises.
class BadIndexFlag {
   public:
    BadIndexFlag() : flag_(Tensor::zeros({1}, DType::i32, core::Device::cuda)) {}
    int* ptr() const {
        return flag_.data<int32_t>();
    }
    // -1 when every index was valid.
    // Under core::exec().indices_checked (a captured step, whose caller checked the indices on the host) the flag is
    // not read: -1 without a synchronisation.
    int64_t first_bad(int64_t n) const {
        if (core::exec().indices_checked) return -1;
        int32_t value = 0;
        MT_CUDA_CHECK(cudaMemcpyAsync(&value, ptr(), sizeof(value), cudaMemcpyDeviceToHost, core::exec_stream()));
        MT_CUDA_CHECK(cudaStreamSynchronize(core::exec_stream()));
        return value == 0 ? -1 : n - value;
    }

   private:
    Tensor flag_;
};

__device__ __forceinline__ void note_bad_index(int* flag, int64_t n, int64_t i) {
    atomicMax(flag, static_cast<int>(n - i));
}

}  // namespace mt::ops::cuda

// Runs the body with the type alias NAME bound to bf16, f16 or float according to dtype (already checked).
#define MT_CUDA_DISPATCH(dtype, NAME, ...)              \
    do {                                                \
        if ((dtype) == ::mt::core::DType::bf16) {       \
            using NAME = ::mt::ops::cuda::bf16;         \
            __VA_ARGS__;                                \
        } else if ((dtype) == ::mt::core::DType::f16) { \
            using NAME = ::mt::ops::cuda::f16;          \
            __VA_ARGS__;                                \
        } else {                                        \
            using NAME = float;                         \
            __VA_ARGS__;                                \
        }                                               \
    } while (0)
