// Barriers and bulk copies of the warp-specialized Hopper kernels: mbarriers (a producer and its consumers inside a
// thread block, where a block-wide barrier would make one side wait on the other), rings of them, named barriers, and
// TMA: tensor-map tile loads that complete on an mbarrier, and bulk reductions from shared to global memory.
#pragma once

#include <cstdint>

namespace mt::ops::cuda {

// A wait on parity P returns once the phase of that parity has completed; on a fresh barrier, waiting on parity 1
// returns at once.
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
// Makes the mbarrier initialisations of this thread visible to the async proxy (TMA) and the other threads; a block
// barrier follows.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
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

// TMA: one box of a 4-D tensor map (attention/flash_tma.h) at coordinates c0..c3 (innermost first) into shared memory
// at dst, counted on mbarrier bar. The map must live in kernel parameter space (__grid_constant__).
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

// Bulk copies from shared memory: dst[i] += src[i] (fp32) over `bytes`, a multiple of 16, as one bulk group member;
// commit closes the group; wait_read<N> returns once all but N groups have read their source (which may be
// overwritten then), wait<N> once they have completed.
template <int kBytes>
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src) {
    asm volatile(
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "n"(kBytes)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Turn-taking between thread blocks over global memory, for bulk reductions that must land in a fixed order (the
// ordered dq sums of flash_bwd_wgmma_fast.cu): a block waits until a counter shows its turn (acquire), issues its
// reductions, waits for them to complete (bulk_wait), and passes the turn on (release). The proxy fence orders the
// generic-proxy flag accesses against the reductions, which the async proxy performs.
__device__ __forceinline__ int ld_acquire_gpu(const int* flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* flag, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Spins until *flag == turn (acquire). A turn that never comes is a bug in the caller's count: after about 2^28
// polls (tens of seconds) the kernel traps, an error instead of a hang.
__device__ __forceinline__ void wait_turn(const int* flag, int turn) {
    for (uint32_t polls = 0; ld_acquire_gpu(flag) != turn; ++polls) {
        if (polls == (1u << 28)) __trap();
        __nanosleep(64);
    }
}

}  // namespace mt::ops::cuda
