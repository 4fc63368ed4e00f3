// Hopper (sm_90a) warpgroup MMA (wgmma): shared-memory matrix descriptors, the fences around the asynchronous
// products, the m64nNk16 bf16 instructions used (both operands in shared memory, or A in registers), and the register
// reallocation between the warpgroups of a warp-specialized kernel. The descriptors here are for 128-byte-swizzled
// tiles (attention/flash_wgmma.cuh has the tile layout and the per-tile descriptors). Accumulators use the mma.sync C
// layout within each warp (warp w of the warpgroup holds rows 16 w .. 16 w + 15).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mt::ops::cuda {

// Host: whether `kernel` (a kernel of an sm_90a build, whose wgmma code is compiled only there) runs on the current
// GPU: a Hopper (compute capability 9.x) and a binary built for it. Callers cache the answer.
inline bool wgmma_kernel_runs(const void* kernel) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) return false;
    return major == 9 && attr.binaryVersion == 90;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_WGMMA_ENABLED 1
#else
#define MT_WGMMA_ENABLED 0
#endif

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (all in 16-byte units), 128-byte
// swizzle.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);
    d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
    d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
    d |= uint64_t{1} << 62;  // 128-byte swizzle
    return d;
}

// cp.async writes reach wgmma (the async proxy) only after this fence in each writing thread and a barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#if MT_WGMMA_ENABLED
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Waits until at most N committed groups are pending (groups complete in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of these registers across the asynchronous wgmma (issue .. wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// D[64 x 32] (+)= A[64 x 16] B[16 x 32]: A and B in shared memory, K-major (TA, TB = 0) or MN-major (1).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, %19, %20;\n"
        "}\n"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: A and B in shared memory, K-major (TA, TB = 0) or MN-major (1).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, %35, %36;\n"
        "}\n"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3]),
          "+f"(d[4][0]),
          "+f"(d[4][1]),
          "+f"(d[4][2]),
          "+f"(d[4][3]),
          "+f"(d[5][0]),
          "+f"(d[5][1]),
          "+f"(d[5][2]),
          "+f"(d[5][3]),
          "+f"(d[6][0]),
          "+f"(d[6][1]),
          "+f"(d[6][2]),
          "+f"(d[6][3]),
          "+f"(d[7][0]),
          "+f"(d[7][1]),
          "+f"(d[7][2]),
          "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128]: A and B in shared memory, K-major (TA, TB = 0) or MN-major (1).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %67, %68;\n"
        "}\n"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3]),
          "+f"(d[4][0]),
          "+f"(d[4][1]),
          "+f"(d[4][2]),
          "+f"(d[4][3]),
          "+f"(d[5][0]),
          "+f"(d[5][1]),
          "+f"(d[5][2]),
          "+f"(d[5][3]),
          "+f"(d[6][0]),
          "+f"(d[6][1]),
          "+f"(d[6][2]),
          "+f"(d[6][3]),
          "+f"(d[7][0]),
          "+f"(d[7][1]),
          "+f"(d[7][2]),
          "+f"(d[7][3]),
          "+f"(d[8][0]),
          "+f"(d[8][1]),
          "+f"(d[8][2]),
          "+f"(d[8][3]),
          "+f"(d[9][0]),
          "+f"(d[9][1]),
          "+f"(d[9][2]),
          "+f"(d[9][3]),
          "+f"(d[10][0]),
          "+f"(d[10][1]),
          "+f"(d[10][2]),
          "+f"(d[10][3]),
          "+f"(d[11][0]),
          "+f"(d[11][1]),
          "+f"(d[11][2]),
          "+f"(d[11][3]),
          "+f"(d[12][0]),
          "+f"(d[12][1]),
          "+f"(d[12][2]),
          "+f"(d[12][3]),
          "+f"(d[13][0]),
          "+f"(d[13][1]),
          "+f"(d[13][2]),
          "+f"(d[13][3]),
          "+f"(d[14][0]),
          "+f"(d[14][1]),
          "+f"(d[14][2]),
          "+f"(d[14][3]),
          "+f"(d[15][0]),
          "+f"(d[15][1]),
          "+f"(d[15][2]),
          "+f"(d[15][3])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: A in registers (the mma.sync A-fragment layout in each warp), B
// MN-major in shared memory (transposed).
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[8][4],
                                             const uint32_t (&a)[4],
                                             uint64_t desc_b,
                                             int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3]),
          "+f"(d[4][0]),
          "+f"(d[4][1]),
          "+f"(d[4][2]),
          "+f"(d[4][3]),
          "+f"(d[5][0]),
          "+f"(d[5][1]),
          "+f"(d[5][2]),
          "+f"(d[5][3]),
          "+f"(d[6][0]),
          "+f"(d[6][1]),
          "+f"(d[6][2]),
          "+f"(d[6][3]),
          "+f"(d[7][0]),
          "+f"(d[7][1]),
          "+f"(d[7][2]),
          "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// D[64 x 128] (+)= A[64 x 16] B[16 x 128]: A in registers (the mma.sync A-fragment layout in each warp), B
// MN-major in shared memory (transposed).
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[16][4],
                                              const uint32_t (&a)[4],
                                              uint64_t desc_b,
                                              int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3]),
          "+f"(d[4][0]),
          "+f"(d[4][1]),
          "+f"(d[4][2]),
          "+f"(d[4][3]),
          "+f"(d[5][0]),
          "+f"(d[5][1]),
          "+f"(d[5][2]),
          "+f"(d[5][3]),
          "+f"(d[6][0]),
          "+f"(d[6][1]),
          "+f"(d[6][2]),
          "+f"(d[6][3]),
          "+f"(d[7][0]),
          "+f"(d[7][1]),
          "+f"(d[7][2]),
          "+f"(d[7][3]),
          "+f"(d[8][0]),
          "+f"(d[8][1]),
          "+f"(d[8][2]),
          "+f"(d[8][3]),
          "+f"(d[9][0]),
          "+f"(d[9][1]),
          "+f"(d[9][2]),
          "+f"(d[9][3]),
          "+f"(d[10][0]),
          "+f"(d[10][1]),
          "+f"(d[10][2]),
          "+f"(d[10][3]),
          "+f"(d[11][0]),
          "+f"(d[11][1]),
          "+f"(d[11][2]),
          "+f"(d[11][3]),
          "+f"(d[12][0]),
          "+f"(d[12][1]),
          "+f"(d[12][2]),
          "+f"(d[12][3]),
          "+f"(d[13][0]),
          "+f"(d[13][1]),
          "+f"(d[13][2]),
          "+f"(d[13][3]),
          "+f"(d[14][0]),
          "+f"(d[14][1]),
          "+f"(d[14][2]),
          "+f"(d[14][3]),
          "+f"(d[15][0]),
          "+f"(d[15][1]),
          "+f"(d[15][2]),
          "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// N in {32, 64, 128}.
template <int N, int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    static_assert(N == 32 || N == 64 || N == 128, "no such wgmma variant");
    if constexpr (N == 32)
        wgmma_ss_n32<TA, TB>(d, desc_a, desc_b, accumulate);
    else if constexpr (N == 64)
        wgmma_ss_n64<TA, TB>(d, desc_a, desc_b, accumulate);
    else
        wgmma_ss_n128<TA, TB>(d, desc_a, desc_b, accumulate);
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4],
                                         const uint32_t (&a)[4],
                                         uint64_t desc_b,
                                         int accumulate) {
    if constexpr (N == 64)
        wgmma_rs_n64(d, a, desc_b, accumulate);
    else
        wgmma_rs_n128(d, a, desc_b, accumulate);
}
#endif  // MT_WGMMA_ENABLED

// setmaxnreg: a warpgroup gives registers back (dec) or takes them (inc), so that producer warpgroups run on few
// registers and the consumers get the rest. N: a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}

}  // namespace mt::ops::cuda
