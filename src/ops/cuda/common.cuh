// Shared helpers of the CUDA ops: bf16/f16/f32 element access with f32 math, 8-wide vector loads and stores,
// deterministic (fixed-order) block reductions, the float-dtype dispatch and launch checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "ops/op_common.h"

namespace mt::ops::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Element <-> f32. bf16 stores round to nearest even, as core::f32_to_bf16 on the host.
__device__ __forceinline__ float to_f32(float x) {
    return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(f16 x) {
    return __half2float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ f16 from_f32<f16>(float x) {
    return __float2half_rn(x);
}

// Two consecutive 2-byte elements <-> two f32 (one conversion instruction each way).
__device__ __forceinline__ float2 pair_to_f32(__nv_bfloat162 h) {
    return __bfloat1622float2(h);
}
__device__ __forceinline__ float2 pair_to_f32(__half2 h) {
    return __half22float2(h);
}
template <typename T>
struct Pair;
template <>
struct Pair<bf16> {
    using type = __nv_bfloat162;
    __device__ static type from(float a, float b) {
        return __floats2bfloat162_rn(a, b);
    }
};
template <>
struct Pair<f16> {
    using type = __half2;
    __device__ static type from(float a, float b) {
        return __floats2half2_rn(a, b);
    }
};

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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
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
    int64_t first_bad(int64_t n) const {
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

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the SFU alone (ex2.approx.ftz: ~2 ulp, results below 2^-126 flushed to zero): exp2f adds a compare and two
// conditional multiplies around it for the subnormal results, expf ~10 instructions.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
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
