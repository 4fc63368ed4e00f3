// Asynchronous global -> shared copies (cp.async, sm_80 and later): each thread issues its copies, groups them with
// cp_async_commit, and waits for all but the newest N groups with cp_async_wait<N>; a barrier then makes the data
// visible to the other threads of the block.
#pragma once

#include <cstdint>

namespace mt::ops::cuda {

// The shared-memory address of p: the 32-bit operand of cp.async, ldmatrix and the mbarrier instructions.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (.cg: cached in L2 only). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
// 16 bytes, or zeros when !valid (src must still be a mapped address).
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
    cp_async16_zfill(smem_u32(dst), src, valid);
}
// 4 bytes (.ca: cached in L1 too), or zeros when !valid.
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N of this thread's committed groups are pending (groups complete in order).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace mt::ops::cuda
