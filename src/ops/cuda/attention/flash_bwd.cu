// Flash-attention backward (FlashAttention-2 algorithm) on tensor cores, bf16 with D a multiple of 8 up to 128 (tiles
// of 64 or 128 columns, flash_tile_d; the padding columns are zero and not stored). P is recomputed from the saved lse;
// with delta_i = dout_i . out_i, dS = P * (dP - delta), dP = dO V^T. Two kernels, no atomics:
//  * dk/dv: one thread block per (key block of kBN keys, kv head, batch row), over all Tk keys; each warp owns 16 keys
//    and keeps their dK and dV rows in fp32 registers while the block walks the query heads of its group and, for
//    each, the query blocks from the diagonal (row 0 for a prefix key) to the block's last viewer (attention_mask.cuh),
//    in a fixed order: GQA sums over the group are deterministic. A block no query sees writes zeros.
//    Per query block: S^T = K Q^T, P^T, dP^T = V dO^T, dS^T, then dV += P^T dO and dK += dS^T Q.
//  * dq: one thread block per (query block, query head, batch row); each warp owns 16 query rows and walks the key
//    blocks from its first row's first key up to its last row's position: S = Q K^T, P, dP = dO V^T, dS, dQ += dS K.
// Q / dO (dk/dv kernel) and K / V (dq kernel) are double-buffered in shared memory by cp.async.
// Bidirectional (AttnParams::causal false) is its own instantiation of each kernel: a key's viewers are its document's
// queries (query_blocks), a query row's keys end at its document's end (key_hi), and inside edge blocks a pair counts
// when query and key share a document (doc_of).
#include <cuda_bf16.h>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/attention/flash_common.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

constexpr int kWarps = 4, kThreads = kWarps * 32, kBlk = 16 * kWarps;  // rows per block on both sides

template <int D>
constexpr int bwd_smem_bytes() {
    return 6 * kBlk * (D + 8) * static_cast<int>(sizeof(bf16)) + 4 * kBlk * static_cast<int>(sizeof(float));
}

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// acc[16 x 8 * (N)] += A-rows (16 x D, shared, row-major) times B^T where B is stored [n][k] (n rows, D wide).
template <int D, int N>
__device__ __forceinline__ void gemm_rows_nk(float (&acc)[N][4], const bf16* sa, int a_row0, const bf16* sb, int lane) {
    constexpr int kLds = D + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        load_a(a, sa, kLds, a_row0, kk * 16, lane);
#pragma unroll
        for (int nb = 0; nb < N / 2; ++nb) {
            uint32_t bb[4];
            load_b_nk(bb, sb, kLds, nb * 16, kk * 16, lane);
            mma_16816(acc[2 * nb], a, bb[0], bb[1]);
            mma_16816(acc[2 * nb + 1], a, bb[2], bb[3]);
        }
    }
}

// acc[16 x D] += P (16 x kBlk, C-fragment registers) times B, B stored [k][n] (kBlk rows, D wide) in shared.
template <int D>
__device__ __forceinline__ void gemm_regs_kn(float (&acc)[D / 8][4],
                                             const float (&pf)[kBlk / 8][4],
                                             const bf16* sb,
                                             int lane) {
    constexpr int kLds = D + 8;
#pragma unroll
    for (int kk = 0; kk < kBlk / 16; ++kk) {
        uint32_t a[4];
        pack_a(a, pf, kk);
#pragma unroll
        for (int db = 0; db < D / 16; ++db) {
            uint32_t bb[4];
            load_b_kn(bb, sb, kLds, kk * 16, db * 16, lane);
            mma_16816(acc[2 * db], a, bb[0], bb[1]);
            mma_16816(acc[2 * db + 1], a, bb[2], bb[3]);
        }
    }
}

// Loads kBlk floats of a [t] row (lse or delta) at r0 into shared; entries >= t are zero.
__device__ __forceinline__ void load_row_f32(float* s, const float* g, int r0, int t, int idx) {
    const bool valid = r0 + idx < t;
    cp_async4_zfill(smem_u32(s + idx), g + (valid ? r0 + idx : 0), valid);
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 2) flash_bwd_dkdv_kernel(const AttnParams p) {
    constexpr int kLds = D + 8, kTile = kBlk * kLds;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* s_k = reinterpret_cast<bf16*>(smem);                  // [kBlk][kLds]
    bf16* s_v = s_k + kTile;                                    // [kBlk][kLds]
    bf16* s_q = s_v + kTile;                                    // [2][kBlk][kLds]
    bf16* s_do = s_q + 2 * kTile;                               // [2][kBlk][kLds]
    float* s_lse = reinterpret_cast<float*>(s_do + 2 * kTile);  // [2][kBlk]
    float* s_delta = s_lse + 2 * kBlk;                          // [2][kBlk]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_block = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, t = p.t, tk = p.tk;
    const int group = p.hq / p.hkv;
    const int64_t qrs = static_cast<int64_t>(p.hq) * p.d, krs = static_cast<int64_t>(p.hkv) * p.d;
    const int64_t kv_off = (static_cast<int64_t>(b) * tk * p.hkv + kh) * p.d;
    const int n0 = n_block * kBlk;
    const bool masked = attn_mask::active(p);
    int first_q, end_q;
    attn_mask::query_blocks(p, b, n0, kBlk, kBlk, &first_q, &end_q);
    const int q_blocks = end_q - first_q, iters = group * q_blocks;
    const float scale_log2 = p.scale * kLog2e;

    // Rows of query head h: q and dout at qg(h) + i * qrs; lse and delta at (b * hq + h) * t + i.
    auto issue = [&](int it, int st) {
        const int h = kh * group + it / q_blocks, m0 = (first_q + it % q_blocks) * kBlk;
        const int64_t q_off = (static_cast<int64_t>(b) * t * p.hq + h) * p.d;
        const int64_t row_off = (static_cast<int64_t>(b) * p.hq + h) * t;
        load_tile<kBlk, D, kThreads>(s_q + st * kTile, static_cast<const bf16*>(p.q) + q_off, qrs, m0, t, p.d, tid);
        load_tile<kBlk, D, kThreads>(s_do + st * kTile, static_cast<const bf16*>(p.dout) + q_off, qrs, m0, t, p.d, tid);
        if (tid < kBlk)
            load_row_f32(s_lse + st * kBlk, p.lse + row_off, m0, t, tid);
        else if (tid < 2 * kBlk)
            load_row_f32(s_delta + st * kBlk, p.delta + row_off, m0, t, tid - kBlk);
    };

    if (iters > 0) {  // else a prefix block no query sees: nothing to load, dK = dV = 0
        load_tile<kBlk, D, kThreads>(s_k, static_cast<const bf16*>(p.k) + kv_off, krs, n0, tk, p.d, tid);
        load_tile<kBlk, D, kThreads>(s_v, static_cast<const bf16*>(p.v) + kv_off, krs, n0, tk, p.d, tid);
        issue(0, 0);
    }
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
    zero_acc(dk);
    zero_acc(dv);
    const int key0 = n0 + warp * 16 + lane / 4;  // this thread's keys: key0 and key0 + 8
    int kdoc[2] = {0, 0};                        // bidirectional: their documents (-1 past tk: no query's)
    int key_doc = -1;                            // bidirectional: the block's one document (block_doc), or -1
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) kdoc[r] = key0 + r * 8 < tk ? attn_mask::doc_of(p, b, key0 + r * 8) : -1;
        key_doc = attn_mask::block_doc(p, b, n0, kBlk);
    }

    for (int it = 0; it < iters; ++it) {
        const int st = it & 1;
        if (it + 1 < iters) issue(it + 1, st ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* sq = s_q + st * kTile;
        const bf16* sdo = s_do + st * kTile;
        const float* slse = s_lse + st * kBlk;
        const float* sdelta = s_delta + st * kBlk;
        const int m0 = (first_q + it % q_blocks) * kBlk;
        // A block with a query before some key (the first row's position before the last key), the one holding rows
        // >= t, or one whose last row's first key is after this block's first. Bidirectional: any block whose keys
        // and queries are not all of one document.
        const bool edge = kCausal ? p.off + m0 < n0 + kBlk - 1 || m0 + kBlk > t ||
                                        (masked && attn_mask::key_lo(p, b, min(m0 + kBlk, t) - 1) > n0)
                                  : !attn_mask::bidir_tile_full(p, b, m0, kBlk, key_doc);

        float pt[kBlk / 8][4];  // S^T, then P^T: [16 keys x kBlk queries]
        zero_acc(pt);
        gemm_rows_nk<D>(pt, s_k, warp * 16, sq, lane);
        float dpt[kBlk / 8][4];  // dP^T, then dS^T
        zero_acc(dpt);
        gemm_rows_nk<D>(dpt, s_v, warp * 16, sdo, lane);
#pragma unroll
        for (int i = 0; i < kBlk / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + (e / 2) * 8, qc = i * 8 + (lane % 4) * 2 + (e % 2), query = m0 + qc;
                bool valid;
                if constexpr (kCausal)
                    valid = !edge ||
                            (p.off + query >= key && query < t && (!masked || key >= attn_mask::key_lo(p, b, query)));
                else
                    valid = !edge || (query < t && attn_mask::doc_of(p, b, p.off + query) == kdoc[e / 2]);
                const float pv = valid ? fast_exp2(pt[i][e] * scale_log2 - slse[qc] * kLog2e) : 0.0f;
                pt[i][e] = pv;
                dpt[i][e] = pv * (dpt[i][e] - sdelta[qc]);
            }
        }
        gemm_regs_kn<D>(dv, pt, sdo, lane);
        gemm_regs_kn<D>(dk, dpt, sq, lane);
        __syncthreads();  // every warp is done with this stage before the next iteration refills it
    }

    bf16* dkg = static_cast<bf16*>(p.dk) + kv_off;
    bf16* dvg = static_cast<bf16*>(p.dv) + kv_off;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = key0 + r * 8;
        if (key >= tk) continue;
        bf16* krow = dkg + key * krs + (lane % 4) * 2;
        bf16* vrow = dvg + key * krs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            if (i * 8 >= p.d) continue;  // the tile's zero padding past the head dim
            *reinterpret_cast<uint32_t*>(krow + i * 8) = pack_bf16(dk[i][2 * r] * p.scale, dk[i][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t*>(vrow + i * 8) = pack_bf16(dv[i][2 * r], dv[i][2 * r + 1]);
        }
    }
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 2) flash_bwd_dq_kernel(const AttnParams p) {
    constexpr int kLds = D + 8, kTile = kBlk * kLds;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* s_q = reinterpret_cast<bf16*>(smem);  // [kBlk][kLds]
    bf16* s_do = s_q + kTile;                   // [kBlk][kLds]
    bf16* s_k = s_do + kTile;                   // [2][kBlk][kLds]
    bf16* s_v = s_k + 2 * kTile;                // [2][kBlk][kLds]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (p.hq / p.hkv), t = p.t, tk = p.tk;
    const int64_t qrs = static_cast<int64_t>(p.hq) * p.d, krs = static_cast<int64_t>(p.hkv) * p.d;
    const int64_t q_off = (static_cast<int64_t>(b) * t * p.hq + h) * p.d;
    const int64_t kv_off = (static_cast<int64_t>(b) * tk * p.hkv + kh) * p.d;
    const bf16* kg = static_cast<const bf16*>(p.k) + kv_off;
    const bf16* vg = static_cast<const bf16*>(p.v) + kv_off;
    const int m0 = m_block * kBlk, last_row = min(m0 + kBlk, t) - 1;
    // Bidirectional: the block's first and last rows' last keys (and documents); causal: unused.
    const attn_mask::BlockHi bhi = kCausal ? attn_mask::BlockHi{} : attn_mask::block_hi(p, b, m0, last_row);
    const int j0 = attn_mask::first_key_block(p, b, m0, kBlk);
    const int n_blocks = kCausal ? attn_mask::end_key_block(p, last_row, kBlk) : bhi.last / kBlk + 1;
    const float scale_log2 = p.scale * kLog2e;

    load_tile<kBlk, D, kThreads>(s_q, static_cast<const bf16*>(p.q) + q_off, qrs, m0, t, p.d, tid);
    load_tile<kBlk, D, kThreads>(s_do, static_cast<const bf16*>(p.dout) + q_off, qrs, m0, t, p.d, tid);
    load_tile<kBlk, D, kThreads>(s_k, kg, krs, j0 * kBlk, tk, p.d, tid);
    load_tile<kBlk, D, kThreads>(s_v, vg, krs, j0 * kBlk, tk, p.d, tid);
    cp_async_commit();

    const int row0 = m0 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8
    const int pos0 = p.off + row0;               // the key position of row0
    const int64_t row_off = (static_cast<int64_t>(b) * p.hq + h) * t;
    float lse2[2], delta[2];
    int lo[2] = {0, 0};  // the rows' first keys; key blocks starting before the last row's hold masked keys
    const int lo_last = attn_mask::active(p) ? attn_mask::key_lo(p, b, last_row) : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + r * 8;
        lse2[r] = row < t ? p.lse[row_off + row] * kLog2e : 0.0f;
        delta[r] = row < t ? p.delta[row_off + row] : 0.0f;
        if (attn_mask::active(p) && row < t) lo[r] = attn_mask::key_lo(p, b, row);
    }
    // Bidirectional: the rows' last keys (rows >= t: every key, never stored), and the first row's, the smallest.
    int hi[2] = {0, 0}, hi_first = 0;
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) hi[r] = row0 + r * 8 < t ? attn_mask::row_hi(p, b, row0 + r * 8, bhi) : tk - 1;
        hi_first = bhi.first;
    }
    float dq[D / 8][4];
    zero_acc(dq);

    for (int j = j0; j < n_blocks; ++j) {
        const int st = (j - j0) & 1;
        if (j + 1 < n_blocks) {
            load_tile<kBlk, D, kThreads>(s_k + (st ^ 1) * kTile, kg, krs, (j + 1) * kBlk, tk, p.d, tid);
            load_tile<kBlk, D, kThreads>(s_v + (st ^ 1) * kTile, vg, krs, (j + 1) * kBlk, tk, p.d, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16* sk = s_k + st * kTile;
        const bf16* sv = s_v + st * kTile;
        const int n0 = j * kBlk;
        const bool edge = n0 + kBlk - 1 > (kCausal ? p.off + m0 : hi_first) || n0 < lo_last;

        float ps[kBlk / 8][4];  // S, then P: [16 queries x kBlk keys]
        zero_acc(ps);
        gemm_rows_nk<D>(ps, s_q, warp * 16, sk, lane);
        float ds[kBlk / 8][4];  // dP, then dS
        zero_acc(ds);
        gemm_rows_nk<D>(ds, s_do, warp * 16, sv, lane);
#pragma unroll
        for (int i = 0; i < kBlk / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2, pos = kCausal ? pos0 + r * 8 : hi[r], key = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
                const bool masked = edge && (key > pos || key < lo[r]);
                const float pv = masked ? 0.0f : fast_exp2(ps[i][e] * scale_log2 - lse2[r]);
                ds[i][e] = pv * (ds[i][e] - delta[r]);
            }
        }
        gemm_regs_kn<D>(dq, ds, sk, lane);
        __syncthreads();  // every warp is done with this stage before the next iteration refills it
    }

    bf16* dqg = static_cast<bf16*>(p.dq) + q_off;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + r * 8;
        if (row >= t) continue;
        bf16* qrow = dqg + row * qrs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
            if (i * 8 < p.d)
                *reinterpret_cast<uint32_t*>(qrow + i * 8) =
                    pack_bf16(dq[i][2 * r] * p.scale, dq[i][2 * r + 1] * p.scale);
    }
}

template <int D, bool kCausal>
void launch_bwd(const AttnParams& p) {
    constexpr int smem = bwd_smem_bytes<D>();
    static const bool configured = [] {
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(flash_bwd_dkdv_kernel<D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(flash_bwd_dq_kernel<D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const unsigned key_blocks = static_cast<unsigned>((p.tk + kBlk - 1) / kBlk);
    const unsigned query_blocks = static_cast<unsigned>((p.t + kBlk - 1) / kBlk);
    flash_bwd_dkdv_kernel<D, kCausal><<<dim3(key_blocks, p.hkv, p.b), kThreads, smem, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
    flash_bwd_dq_kernel<D, kCausal><<<dim3(query_blocks, p.hq, p.b), kThreads, smem, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void flash_bwd(const AttnParams& p) {
    launch_flash(p, [&](auto d, auto causal) { launch_bwd<decltype(d)::value, decltype(causal)::value>(p); });
}

}  // namespace mt::ops::cuda
