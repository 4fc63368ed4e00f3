// ldmatrix: four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory into the registers of
// a warp, lane l supplying the row address of matrix l / 8, row l % 8; lane (g, t) = (l / 4, l % 4) receives row g,
// elements 2t and 2t + 1 of each matrix in r[0..3]. That is the mma.sync fragment layout, for bf16 operands and, read
// as 32-bit words, for TF32 ones. Rows 16-byte aligned.
#pragma once

#include <cstdint>

#include "ops/cuda/prim/cp_async.cuh"

namespace mt::ops::cuda {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    ldmatrix_x4(r, smem_u32(p));
}
// The transposed load (.trans): lane (g, t) receives column g, rows 2t and 2t + 1 (a B operand stored [k][n]).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace mt::ops::cuda
