// Kimi Delta Attention (KDA, spec kda.md §2 and §4): the gated delta rule with one decay per key channel.
// Per value head, with alpha_t = exp(g_t) and state S [K, V]:
//   S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
//   q, k:  [B, T, H, K] f32|f64 (q already scaled and both L2-normalised by the caller; the op does neither)
//   v:     [B, T, HV, V], HV % H == 0: value head hv reads q/k head hv / (HV / H) (GVA)
//   g:     [B, T, HV, K] log decay per key channel (<= 0), the gate's output
//   beta:  [B, T, HV]
//   s0:    [B, HV, K, V] initial state, or undefined (zero state)
//   out:   [B, T, HV, V]
//   st:    [B, HV, K, V] final state S_T, or undefined (not returned)
// Both tensors and states share one dtype (f32 or f64 on the CPU). Without a KdaSaved, _fwd saves nothing beyond its
// inputs and _bwd recomputes every chunk quantity and the per-chunk states from q, k, v, g, beta, s0; with one, the
// CUDA path keeps some of them from _fwd for _bwd (KdaSaved below). The gradients are the same either way.
// _bwd: dst [B, HV, K, V] or undefined (zero); dq, dk, dv, dg, dbeta written (=); ds0 written (=), and must be
// defined exactly when s0 is. dq and dk sum over the HV / H value heads of a group.
// Algorithms (KdaOptions): `recurrent` is the token loop above, the reference; `chunked` is kda.md §4.1: chunks
// of chunk_size (64 or 32) tokens in sub-chunks of 16, the UT/WY form with T = (I + L)^{-1}, every decay factor of
// an off-diagonal sub-chunk tile anchored at the tile's first row (both factors <= 1). The diagonal tiles use
//   matmul:   the same first-row anchor, so the column factor exp(Gamma_m - Gamma_j) reaches exp(15 |g|): one plain
//             16 x 16 x K product, then masked. Finite in f32 only while 15 |g| < 88.7, i.e. for the lower-bounded
//             gate (g >= l >= -5); the unbounded softplus gate overflows (tests/ops/kda_bound_test.cpp shows it).
//   pairwise: sum_d q_id k_jd exp(Gamma_id - Gamma_jd) per entry, every factor <= 1, valid for any gate.
#pragma once

#include <cstdint>
#include <string>

#include "ops/op_common.h"

namespace mt::ops {

enum class KdaAlgorithm { recurrent, chunked };
enum class KdaDiagonal { matmul, pairwise };
// How a call with KdaOptions::doc_start runs a row's documents (ops/kda.cpp; the packed layout: ops/cpu/kda_pack.h):
//   split:     each document as its own sequence, one set of kernel launches per document (exact for any algorithm;
//              the reference, and the CPU's choice under automatic);
//   packed:    the varlen path: every document of a row starts on a chunk boundary of one packed row (its tail padded
//              with inert tokens), chunk_reset flags restart the state at each, and ONE set of launches runs all of
//              them (the chunked algorithm only; the CUDA choice under automatic).
enum class KdaDocuments { automatic, split, packed };

// Which CUDA kernels a call runs (the CPU ignores it). The layers keep the defaults; a test or benchmark sets a field
// to reach one variant. The choice is made once per call from these fields, the shapes and the dtype.
struct KdaKernels {
    // false: bf16/f16 inputs take the fp32 kernels (the path of f32 inputs, the reference on the device) instead
    // of the tensor-core prep, scans and backward products.
    bool tensor_cores = true;
    // false: the backward's chunk step at K = V = 128 runs the general tensor-core chunk kernel instead of the
    // one holding every operand in shared memory.
    bool chunk_smem = true;
    // The value-column tile of the tensor-core forward and reverse scans: 0 picks one per shape (the least modelled
    // time); 16, 32, 64 or 128 forces that tile where it divides V and fits in shared memory.
    int scan_bv = 0;
    int rscan_bv = 0;
};

struct KdaOptions {
    KdaAlgorithm algorithm = KdaAlgorithm::chunked;
    KdaDiagonal diagonal = KdaDiagonal::matmul;
    int64_t chunk_size = 64;  // 64 or 32; sub-chunks are 16 tokens
    // With a KdaSaved: also keep the state entering each chunk and Vn (kda.md §4.6 `save_states`), so _bwd skips
    // its forward scan, for 1,536 more bytes per token and value head at K = V = 128.
    bool save_states = false;
    // With a KdaSaved: keep everything the backward would recompute (the states too, as save_states, and Gamma, Qg,
    // Kg, W: 2,048 more bytes per token and value head at K = 128), so _bwd runs no forward kernel at all.
    bool save_workspace = false;
    // With a KdaSaved: keep only the state entering each chunk and Vn, rounded to bf16 (768 bytes per token and
    // value head at K = V = 128, within the 776 of fla's chunk_kda), so _bwd skips its forward scan but forms the
    // chunk tiles again. Alone: not with save_states or save_workspace. The backward's products then read h and Vn
    // at bf16 precision (kda.md "What the forward keeps"). Taken where the backward's products over V run on tensor
    // cores (V % 32 == 0); elsewhere the KdaSaved stays empty and _bwd recomputes.
    bool save_states_bf16 = false;
    KdaKernels kernels = {};
    // Document masking of packed rows (long_context.md §2): a [B, T] i32 document-start map as
    // AttentionMask::doc_start (ops/attention.h). The state restarts from zero at every document's first token, so
    // a document never reads an earlier one; s0 is the state before each row's first document and st (dst) the
    // state after (the gradient into) its last. Undefined: one document per row.
    Tensor doc_start = Tensor();
    KdaDocuments documents = KdaDocuments::automatic;
    // Chunked algorithm only: [B, ceil(T / chunk_size)] i32 flags on the inputs' device, or undefined (none). A
    // nonzero flag at (b, n) makes the state entering chunk n of row b zero instead of the state carried from chunk
    // n - 1 (or s0 at n = 0), so no gradient flows from chunk n back into the chunks before it (nor into ds0 at
    // n = 0). The packed document path sets it; it cannot be combined with doc_start.
    Tensor chunk_reset = Tensor();
    // When set, a CUDA call writes here the kernels it ran (benchmarks print it as their `impl`); the CPU writes
    // the algorithm's name.
    std::string* chosen = nullptr;
};

// What a CUDA kda_fwd keeps for kda_bwd (kda.md §4.6) when given one, as flat f32 tensors laid out
// [B * HV, nc, rows, cols] with nc = ceil(T / C): the chunk tiles A, M and T = (I + L)^-1 ([C, C] per chunk: 768 bytes
// per token and value head at C = 64), so _bwd does not recompute them; with KdaOptions::save_states also hs, the
// state entering each chunk ([K, V] per chunk), and Vn ([C, V]); with save_workspace also those and gam, qg, kg, w
// ([C, K] each: Gamma, q e^Gamma, k e^(Gamma_last - Gamma) and W of kda.md §4.1). With save_states_bf16 only hs and
// Vn, as bf16 tensors, and no tiles. Filled on the tensor-core path
// (bf16/f16 inputs, K % 16 == 0, K <= 128, V % 16 == 0, KdaKernels::tensor_cores) and left empty elsewhere
// (the CPU, f32 inputs): an empty KdaSaved makes _bwd recompute everything. Under doc_start the packed path keeps
// one of the packed rows' shapes (its backward reads it there); the split path keeps nothing. _bwd only reads it; one
// kept by a call of other shapes or chunk size, or not fitting in any tensor, is an error that names it.
struct KdaSaved {
    Tensor a, m, t, hs, vn, gam, qg, kg, w;
    // The forward call that filled it: B, T, HV, K, V and the chunk size (kda_bwd compares its own); under the packed
    // document path T is the packed rows' length and `layout` the packed layout's fingerprint (kda_packed_layout),
    // which the backward compares too (two document maps can pack to the same length); 0 without packing.
    int64_t b = 0, seq = 0, hv = 0, k = 0, v = 0, chunk = 0;
    uint64_t layout = 0;
    bool has_tiles() const {
        return t.defined();
    }
    bool has_states() const {
        return hs.defined();
    }
    bool has_workspace() const {
        return w.defined();
    }
    // hs and Vn in bf16 without the tiles (KdaOptions::save_states_bf16).
    bool has_bf16_states() const {
        return hs.defined() && !t.defined();
    }
    bool empty() const {
        return !t.defined() && !hs.defined();
    }
};

// The fingerprint of the packed layout of a document-start map (KdaOptions::doc_start, on any device) at this chunk
// size, as KdaSaved::layout records it: every packed position's source token, so different maps differ (up to
// 64-bit hash collisions). Never 0.
uint64_t kda_packed_layout(const Tensor& doc_start, int64_t chunk);

// Sub-chunk (tile) size of the chunked algorithm.
inline constexpr int64_t kKdaSubChunk = 16;

void kda_fwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& out,
             const Tensor& st,
             const KdaOptions& options = {},
             KdaSaved* saved = nullptr);
void kda_bwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& dout,
             const Tensor& dst,
             const Tensor& dq,
             const Tensor& dk,
             const Tensor& dv,
             const Tensor& dg,
             const Tensor& dbeta,
             const Tensor& ds0,
             const KdaOptions& options = {},
             const KdaSaved* saved = nullptr);

// One step of context parallelism's affine state fold (nn/layers/kda_cp.cpp), in host memory and f64. maps holds
// each of `heads` heads' span map as K rows of V + K columns, [h | M]: h the state the span reaches from zero, M
// [K, K] the map of its start state. kda_state_fold_fwd: out = h + M in (S_out from S_in); kda_state_fold_bwd: out =
// own + M^T in (dS_in from dS_out, own the span's own start-state gradient). in, own and out are dense [heads, K, V];
// out must not overlap in. One single-threaded GEMM per head, OpenMP over the heads: the result does not depend on
// the thread count.
void kda_state_fold_fwd(int64_t heads, int64_t k, int64_t v, const double* maps, const double* in, double* out);
void kda_state_fold_bwd(
    int64_t heads, int64_t k, int64_t v, const double* maps, const double* own, const double* in, double* out);

}  // namespace mt::ops
