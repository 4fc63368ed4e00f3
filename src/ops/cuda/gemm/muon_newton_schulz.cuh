// Pieces of the CUDA Newton-Schulz (gemm/muon_newton_schulz.cu) that muon_step (elementwise/muon_step.cu) shares: the
// stack's layout, the per-matrix norm's last pass, a fixed-order sum into an f64 scalar, and the iteration itself.
// The elementwise passes cut each matrix into chunks of kChunk elements, one block per (matrix, chunk), so every sum
// has a fixed order: per-block partials, then one pass over them in order.
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/muon.h"

namespace mt::ops::cuda::muon {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;  // elements of one matrix per block of the elementwise passes

// A stack [E, A, B] and its bf16 work buffers. The iterate X (p x q, p = min(A, B)) is stored in the input's own
// row-major layout: X itself when A <= B, X^T when A > B (the products take the transposition, so no pass moves
// data). Each matrix of the work buffers starts at a multiple of 16 elements (32 bytes), as cuBLASLt's strided
// batches prefer.
struct Layout {
    int64_t e = 0, a = 0, b = 0;
    int64_t n = 0;       // a b, elements of one matrix
    int64_t chunks = 0;  // blocks per matrix of the elementwise passes
    int64_t p = 0, q = 0;
    bool tall = false;      // A > B
    int64_t x_stride = 0;   // elements from one matrix of an iterate buffer to the next (n rounded up to 16)
    int64_t g_stride = 0;   // the same for the p x p Gram and polynomial buffers
    int64_t blocks() const  // of the elementwise passes
    {
        return e * chunks;
    }
};
Layout layout_of(const Tensor& t);

// The elements [begin, end) of matrix e that block blockIdx.x of an elementwise pass covers.
struct ChunkRange {
    int64_t e, begin, end;
};
__device__ __forceinline__ ChunkRange chunk_range(int64_t n, int64_t chunks) {
    const int64_t b = blockIdx.x, e = b / chunks, begin = (b % chunks) * kChunk;
    return {e, begin, begin + kChunk < n ? begin + kChunk : n};
}

// inv[e] = 1 / (sqrt(sum_c partial[e chunks + c]) + 1e-7): the Frobenius normalisation of muon.md §1 (f64 sums, the
// factor in f32).
void launch_inv_norm(const Layout& l, const double* partial, float* inv);
// *dst += partial[0] + ... + partial[count - 1], in a fixed order (one block).
void launch_add_sum(const double* partial, int64_t count, double* dst);
// dst[e] += matrix e's partials (l.chunks of them per matrix, as launch_inv_norm's), in a fixed order.
void launch_add_sums(const Layout& l, const double* partial, double* dst);
// The K = hyper.total_steps() Newton-Schulz steps of muon.md §1 on the stack whose X_0 is in buf0 (bf16, normalised),
// buf1 the other iterate buffer: three strided-batched bf16 cuBLASLt GEMMs per step (fp32 accumulation), on the ops'
// stream. Returns the buffer holding X_K (buf0 when K is even, else buf1).
bf16* iterate(const Layout& l, const MuonHyper& hyper, bf16* buf0, bf16* buf1);

}  // namespace mt::ops::cuda::muon
