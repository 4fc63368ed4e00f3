// Hopper (sm_90a) building blocks of the wgmma attention kernels: tiles in shared memory in the 128-byte-swizzled
// layout that wgmma reads, filled by cp.async; matrix descriptors; warpgroup fences; the wgmma instructions used.
// A tile [rows][D] (bf16, D a multiple of 64) is stored as D / 64 column blocks of [rows][64], each row 128 bytes
// with its 16-byte chunks XOR-swizzled by (row % 8); column blocks and tiles are 1024-byte aligned. The same bytes
// serve as a K-major operand (the contraction runs along D: Q K^T) and as an MN-major one (the contraction runs
// along the rows: P V).
//   K-major descriptor, 64 rows from row0, k-step kk (16 columns): start = tile + (kk / 4) * rows * 128 + row0 * 128
//     + (kk % 4) * 32, stride byte offset 1024 (8 rows), leading byte offset unused (16).
//   MN-major descriptor, 16 rows from k0, all D columns: start = tile + k0 * 128, leading byte offset rows * 128
//     (the next 64 columns), stride byte offset 1024 (the next 8 rows).
//   The MN-major form serves either operand (the products' TA / TB = 1): flash_bwd_wgmma_fast.cu reads a [keys][64]
//   dS^T tile as the A of dQ = dS K that way, and K from a column offset inside the 64-column block for N = 32.
// Accumulators use the mma.sync C layout within each warp (warp w of the warpgroup holds rows 16 w .. 16 w + 15), so
// the helpers of flash_common.cuh (pack_a, the softmax) apply unchanged.
#pragma once

#include <cstdint>

#include "ops/cuda/flash_common.cuh"

namespace mt::ops::cuda::flash {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MT_WGMMA_ENABLED 1
#else
#define MT_WGMMA_ENABLED 0
#endif

// Loads rows [r0, r0 + ROWS) of a [t, D] matrix (row stride rs elements) into a swizzled tile; rows >= t are zero.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_sw(uint32_t tile, const bf16* g, int64_t rs, int r0, int t, int tid) {
    constexpr int kChunksPerRow = D / 8, kChunks = ROWS * kChunksPerRow;
    static_assert(kChunks % THREADS == 0, "the tile must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kChunks / THREADS; ++i) {
        const int c = tid + i * THREADS, r = c / kChunksPerRow, ch = c % kChunksPerRow;
        const bool valid = r0 + r < t;
        const bf16* src = g + static_cast<int64_t>(valid ? r0 + r : 0) * rs + ch * 8;
        const uint32_t dst = tile + (ch / 8) * (ROWS * 128) + r * 128 + (((ch % 8) ^ (r % 8)) * 16);
        cp_async_16(dst, src, valid);
    }
}

__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = static_cast<uint64_t>((addr & 0x3FFFFu) >> 4);
    d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
    d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
    d |= uint64_t{1} << 62;  // 128-byte swizzle
    return d;
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int kk) {
    return make_desc(tile + (kk / 4) * (ROWS * 128) + row0 * 128 + (kk % 4) * 32, 16, 1024);
}
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0) {
    return make_desc(tile + k0 * 128, ROWS * 128, 1024);
}

// cp.async writes reach wgmma (the async proxy) only after this fence in each writing thread and a barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// mbarriers: between producers and consumers of shared memory inside a thread block, where a block-wide barrier
// would make one side wait on the other (the TMA forward's loads, the fast backward's dq writer). A wait on parity P
// returns once the phase of that parity has completed; on a fresh barrier, waiting on parity 1 returns at once.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces that `bytes` more will land on the barrier through TMA (complete_tx).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// A ring of kStages stages, each with a full and an empty mbarrier (8 bytes apart per stage); use j takes stage
// j % kStages. The consumers wait until use j is filled; the producer waits until the consumers have released use
// j - kStages (for the first kStages uses, parity 1 of a fresh barrier, which reports complete at once).
template <int kStages>
__device__ __forceinline__ void ring_wait_filled(uint32_t full, int j) {
    mbar_wait(full + 8 * (j % kStages), (j / kStages) & 1);
}
template <int kStages>
__device__ __forceinline__ void ring_wait_released(uint32_t empty, int j) {
    mbar_wait(empty + 8 * (j % kStages), ((j / kStages) & 1) ^ 1);
}

// Named barriers 1..15 over `threads` threads (a multiple of 32): sync waits, arrive does not.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// TMA: one box of a 4-D tensor map (flash_tma.h) at coordinates c0..c3 (innermost first) into shared memory at dst,
// counted on mbarrier bar. The map must live in kernel parameter space (__grid_constant__).
__device__ __forceinline__ void tma_load_4d(
    uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
        "%6}], "
        "[%2];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)),
        "r"(bar),
        "r"(c0),
        "r"(c1),
        "r"(c2),
        "r"(c3)
        : "memory");
}

// TMA: rows [row0, row0 + rows) of head `head`, batch `batch` of a [B, T, H, D] tensor map into the swizzled tile
// layout above (D / 64 boxes [rows][64], one per column block); rows past T arrive as zeros.
template <int D>
__device__ __forceinline__ void tma_load_tile(
    uint32_t tile, const void* map, uint32_t bar, int rows, int head, int row0, int batch) {
#pragma unroll
    for (int c = 0; c < D / 64; ++c) tma_load_4d(tile + c * rows * 128, map, bar, c * 64, head, row0, batch);
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

}  // namespace mt::ops::cuda::flash
