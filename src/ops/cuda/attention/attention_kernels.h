// Launchers of the CUDA attention kernels (src/ops/cuda/attention/flash_*.cu for bf16 with D a multiple of 8 up to 128,
// and attention_generic.cu for any dtype and D <= 256). Tensors are raw device pointers in the layouts of
// ops/attention.h: q, out, dout, dq [B, T, Hq, D]; k, v, dk, dv [B, Tk, Hkv, D] (Tk >= T: query i sits at key position
// Tk - T + i); lse, max_logit and delta [B, Hq, T] f32. All run on core::exec_stream() and are deterministic (no
// atomics), except flash_bwd_wgmma_fast unordered.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace mt::ops::cuda {

struct AttnParams {
    const void* q = nullptr;
    const void* k = nullptr;
    const void* v = nullptr;
    const void* out = nullptr;
    const void* dout = nullptr;
    void* out_w = nullptr;  // the forward's output
    float* lse = nullptr;
    float* max_logit = nullptr;    // the forward's optional row max of the scaled scores (null: not written)
    const float* delta = nullptr;  // rowsum(dout * out), from attention_delta
    float* delta_w = nullptr;      // where flash_bwd_wgmma writes delta (it computes it itself)
    void* dq = nullptr;
    void* dk = nullptr;
    void* dv = nullptr;
    float* dq_accum = nullptr;  // flash_bwd_wgmma_fast's fp32 dq sums (its own tiled layout)
    int* dq_turn = nullptr;     // ordered flash_bwd_wgmma_fast: a turn counter per (b, query head, query block)
    // t queries, tk keys; query i sits at key position off + i (off = tk - t, the key prefix).
    int b = 0, t = 0, tk = 0, off = 0, hq = 0, hkv = 0, d = 0;
    // The mask beyond causality (AttentionMask): query i of batch row b, at position s = off + i, sees keys
    // [key_lo, s] with key_lo = max(doc_start[b, s], s - window + 1); doc_start [B, Tk] i32 or null (one document per
    // row), window 0 = none. attention_mask.cuh holds the kernels' helpers. causal false (window 0; every family, the
    // flash kernels in a bidirectional instantiation): query i sees the keys of its document, [key_lo, key_hi] =
    // [doc_start, doc end - 1].
    const int32_t* doc_start = nullptr;
    int window = 0;
    bool causal = true;
    float scale = 0;    // 1 / sqrt(D)
    uint32_t zero = 0;  // always 0: an opaque operand for ptxas (flash_fwd_wgmma.cu)
};

// True when the tensor-core kernels take this head dim (bf16 only): any multiple of 8 up to 128 (rows move in
// 16-byte pieces). They run on tiles of flash_tile_d(d) columns, the columns past d zero-filled on load and never
// stored: D 72 (the reference ViT's, d_v 1152 over 16 heads) costs the products of D 128, still far faster than the
// simple kernels.
inline bool flash_supports(int d) {
    return d >= 8 && d <= 128 && d % 8 == 0;
}
inline int flash_tile_d(int d) {
    return d <= 64 ? 64 : 128;
}

// Tensor-core flash attention, bf16, D a multiple of 8 up to 128 (flash_supports): mma.sync (any GPU from sm_80) and
// wgmma (sm_90a, Hopper).
void flash_fwd(const AttnParams& p);
void flash_bwd(const AttnParams& p);  // needs p.delta
void flash_fwd_wgmma(const AttnParams& p);
void flash_bwd_wgmma(const AttnParams& p);  // writes delta to p.delta_w and reads it back through p.delta
// The 5-matmul backward (one kernel per key block, dq summed with float reductions into p.dq_accum, which it zeroes
// first). Unordered the reductions land as scheduled (not bitwise reproducible); ordered they land in a fixed order,
// the key blocks taking turns on p.dq_turn (zeroed first), and the result is bitwise reproducible. Writes delta to
// p.delta_w and reads it back through p.delta.
void flash_bwd_wgmma_fast(const AttnParams& p, bool ordered);
size_t flash_bwd_wgmma_fast_accum_floats(const AttnParams& p);  // the size of p.dq_accum it needs
size_t flash_bwd_wgmma_fast_turns(const AttnParams& p);         // the ints of p.dq_turn (ordered) it needs
// True when this GPU is a Hopper (sm_90) and the build holds the sm_90a kernels.
bool flash_wgmma_supported();

// Simple kernels for any D <= 256 (one warp per row), element type bf16, f16 or f32.
void attention_generic_fwd(const AttnParams& p, core::DType dtype);
void attention_generic_bwd(const AttnParams& p, core::DType dtype);  // needs p.delta

// delta[b, h, i] = sum_c dout[b, i, h, c] * out[b, i, h, c] in fp32 (the backward's row term).
void attention_delta(const AttnParams& p, float* delta, core::DType dtype);

}  // namespace mt::ops::cuda
