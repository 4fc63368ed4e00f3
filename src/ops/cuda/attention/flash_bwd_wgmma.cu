// Flash-attention backward on Hopper warpgroup MMA (wgmma, sm_90a), bf16 with D a multiple of 8 up to 128 (tiles of
// 64 or 128 columns, flash_tile_d; the padding columns are zero and not stored): the two deterministic
// kernels of flash_bwd.cu (dq per query block, which here also computes delta = rowsum(dO * O) and writes it out;
// then dk/dv per key block looping over the group's query heads and query blocks in a fixed order), each a thread
// block of one warpgroup over 64 rows, with blocks of 64 on the other side. S^T = K Q^T and dP^T = V dO^T (dk/dv), S =
// Q K^T and dP = dO V^T (dq) read both operands from swizzled shared memory; dV += P^T dO, dK += dS^T Q and dQ += dS K
// take P / dS from registers. No atomics. With a key prefix (Tk > T) the dk/dv kernel covers all Tk keys, a block no
// query sees writing zeros, and the edge tests compare positions (attention_mask.cuh). Bidirectional attention
// (AttnParams::causal false) is a second instantiation of each kernel (kCausal false). kFullD: the head dim is the
// tile width, so the strides, the column guards of the loads and stores and the delta loop are compile-time (the
// padded instantiation reads p.d at run time; with it in the 64 and 128 kernels too the backward was ~3% slower).
#include <cuda_bf16.h>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/attention/flash_wgmma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

constexpr int kThreads = 128, kBlk = 64;

template <int D>
constexpr int wg_bwd_smem_bytes() {
    return 6 * kBlk * D * static_cast<int>(sizeof(bf16)) + 4 * kBlk * static_cast<int>(sizeof(float)) + 1024;
}

// dk/dv kernel, rows = keys, columns = queries: P^T = exp2(S^T * scale - lse) into pt, dS^T = P^T (dP^T - delta) into
// dpt. kMask (an edge block: one with a query position before some key, the one holding queries >= t, or one where
// some query's first key is after the block's first key): queries positioned before the key, >= t, or whose first key
// is after it give 0. lse and delta come from shared memory once per column pair. kCausal false (bidirectional): the
// queries of another document than the key's (kdoc: attention_mask.cuh doc_of, -1 for keys >= tk) or >= t give 0.
template <bool kMask, bool kCausal>
__device__ __forceinline__ void dkdv_elementwise(float (&pt)[kBlk / 8][4],
                                                 float (&dpt)[kBlk / 8][4],
                                                 const float* slse,
                                                 const float* sdelta,
                                                 const AttnParams& p,
                                                 int b,
                                                 int key0,
                                                 const int (&kdoc)[2],
                                                 int m0,
                                                 int t,
                                                 float scale_log2,
                                                 int lane) {
#pragma unroll
    for (int i = 0; i < kBlk / 8; ++i) {
        const int qc = i * 8 + (lane % 4) * 2;
        const float2 l = *reinterpret_cast<const float2*>(slse + qc);
        const float2 dl = *reinterpret_cast<const float2*>(sdelta + qc);
        const float nl[2] = {-l.x * kLog2e, -l.y * kLog2e}, dd[2] = {dl.x, dl.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float pv = fast_exp2(fmaf(pt[i][e], scale_log2, nl[e % 2]));
            if constexpr (kMask && !kCausal) {
                const int query = m0 + qc + (e % 2);
                pv = query < t && attn_mask::doc_of(p, b, p.off + query) == kdoc[e / 2] ? pv : 0.0f;
            } else if constexpr (kMask) {
                const int key = key0 + (e / 2) * 8, query = m0 + qc + (e % 2);
                const bool valid = p.off + query >= key && query < t &&
                                   (!attn_mask::active(p) || key >= attn_mask::key_lo(p, b, query));
                pv = valid ? pv : 0.0f;
            }
            pt[i][e] = pv;
            dpt[i][e] = pv * (dpt[i][e] - dd[e % 2]);
        }
    }
}

// dq kernel, rows = queries, columns = keys: P = exp2(S * scale - lse) from ps (only read: the dP product may still
// be running) into pr. kMask (a block ending after the first row's position, or one starting before some row's first
// key): keys after the query's position (pos0: row0's) or before its first key give 0. kCausal false: keys after the
// row's last key hi (its document's end) instead of its position.
template <bool kMask, bool kCausal>
__device__ __forceinline__ void dq_probs(const float (&ps)[kBlk / 8][4],
                                         float (&pr)[kBlk / 8][4],
                                         const float (&lse2)[2],
                                         const int (&lo)[2],
                                         const int (&hi)[2],
                                         int pos0,
                                         int n0,
                                         float scale_log2,
                                         int lane) {
    const float nl[2] = {-lse2[0], -lse2[1]};
#pragma unroll
    for (int i = 0; i < kBlk / 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e / 2;
            float pv = fast_exp2(fmaf(ps[i][e], scale_log2, nl[r]));
            if constexpr (kMask) {
                const int pos = kCausal ? pos0 + r * 8 : hi[r], key = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
                pv = key > pos || key < lo[r] ? 0.0f : pv;
            }
            pr[i][e] = pv;
        }
    }
}

// kCausal false: bidirectional (attention_mask.cuh: query_blocks lists the key block's documents' queries); the causal
// instantiation is the kernel as it was.
template <int D, bool kCausal, bool kFullD>
__global__ void __launch_bounds__(kThreads, 1) flash_bwd_dkdv_wgmma_kernel(const AttnParams p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    constexpr uint32_t kTile = kBlk * D * 2;
    const uint32_t s_k = base, s_v = base + kTile, s_q = base + 2 * kTile, s_do = base + 4 * kTile;  // Q, dO: 2 stages
    float* s_lse = reinterpret_cast<float*>(smem + (base + 6 * kTile - smem_u32(smem)));             // [2][kBlk]
    float* s_delta = s_lse + 2 * kBlk;                                                               // [2][kBlk]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int n_block = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, t = p.t, tk = p.tk;
    const int group = p.hq / p.hkv, hd = kFullD ? D : p.d;  // the head dim
    const int64_t qrs = static_cast<int64_t>(p.hq) * hd, krs = static_cast<int64_t>(p.hkv) * hd;
    const int64_t kv_off = (static_cast<int64_t>(b) * tk * p.hkv + kh) * hd;
    const int n0 = n_block * kBlk;
    int first_q, end_q;
    attn_mask::query_blocks(p, b, n0, kBlk, kBlk, &first_q, &end_q);
    const int q_blocks = end_q - first_q, iters = group * q_blocks;
    const float scale_log2 = p.scale * kLog2e;

    auto issue = [&](int it, int st) {
        const int h = kh * group + it / q_blocks, m0 = (first_q + it % q_blocks) * kBlk;
        const int64_t q_off = (static_cast<int64_t>(b) * t * p.hq + h) * hd;
        const int64_t row_off = (static_cast<int64_t>(b) * p.hq + h) * t;
        load_tile_sw<kBlk, D, kThreads>(s_q + st * kTile, static_cast<const bf16*>(p.q) + q_off, qrs, m0, t, hd, tid);
        load_tile_sw<kBlk, D, kThreads>(
            s_do + st * kTile, static_cast<const bf16*>(p.dout) + q_off, qrs, m0, t, hd, tid);
        if (tid < kBlk)
            cp_async4_zfill(
                smem_u32(s_lse + st * kBlk + tid), p.lse + row_off + (m0 + tid < t ? m0 + tid : 0), m0 + tid < t);
        else
            cp_async4_zfill(smem_u32(s_delta + st * kBlk + tid - kBlk),
                            p.delta + row_off + (m0 + tid - kBlk < t ? m0 + tid - kBlk : 0),
                            m0 + tid - kBlk < t);
    };

    if (iters > 0) {  // else a prefix block no query sees: nothing to load, dK = dV = 0
        load_tile_sw<kBlk, D, kThreads>(s_k, static_cast<const bf16*>(p.k) + kv_off, krs, n0, tk, hd, tid);
        load_tile_sw<kBlk, D, kThreads>(s_v, static_cast<const bf16*>(p.v) + kv_off, krs, n0, tk, hd, tid);
        issue(0, 0);
    }
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    const int key0 = n0 + warp * 16 + lane / 4;  // this thread's keys: key0 and key0 + 8
    int kdoc[2] = {0, 0};                        // bidirectional: their documents (-1 past tk: no query's)
    int key_doc = -1;                            // bidirectional: the block's one document (block_doc), or -1
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) kdoc[r] = key0 + r * 8 < tk ? attn_mask::doc_of(p, b, key0 + r * 8) : -1;
        key_doc = attn_mask::block_doc(p, b, n0, kBlk);
    }

    for (int it = 0; it < iters; ++it) {
        const int st = it & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // stage st is in shared memory, and the products of iteration it - 1 are done
        if (it + 1 < iters) issue(it + 1, st ^ 1);
        cp_async_commit();
        const uint32_t sq = s_q + st * kTile, sdo = s_do + st * kTile;
        const float* slse = s_lse + st * kBlk;
        const float* sdelta = s_delta + st * kBlk;
        const int m0 = (first_q + it % q_blocks) * kBlk;
        // Bidirectional: every pair is seen when all the block's keys and queries are of one document.
        const bool edge = kCausal ? p.off + m0 < n0 + kBlk - 1 || m0 + kBlk > t ||
                                        (attn_mask::active(p) && attn_mask::key_lo(p, b, min(m0 + kBlk, t) - 1) > n0)
                                  : !attn_mask::bidir_tile_full(p, b, m0, kBlk, key_doc);

        float pt[kBlk / 8][4], dpt[kBlk / 8][4];  // S^T then P^T; dP^T then dS^T: [64 keys x 64 queries]
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBlk>(pt, desc_k<kBlk>(s_k, 0, kk), desc_k<kBlk>(sq, 0, kk), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBlk>(dpt, desc_k<kBlk>(s_v, 0, kk), desc_k<kBlk>(sdo, 0, kk), kk);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(pt);
        fence_regs(dpt);
        if (edge)
            dkdv_elementwise<true, kCausal>(pt, dpt, slse, sdelta, p, b, key0, kdoc, m0, t, scale_log2, lane);
        else
            dkdv_elementwise<false, kCausal>(pt, dpt, slse, sdelta, p, b, key0, kdoc, m0, t, scale_log2, lane);
        uint32_t pa[kBlk / 16][4], dsa[kBlk / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBlk / 16; ++kk) {
            pack_a(pa[kk], pt, kk);
            pack_a(dsa[kk], dpt, kk);
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlk / 16; ++kk) wgmma_rs<D>(dv, pa[kk], desc_mn<kBlk>(sdo, kk * 16), 1);
#pragma unroll
        for (int kk = 0; kk < kBlk / 16; ++kk) wgmma_rs<D>(dk, dsa[kk], desc_mn<kBlk>(sq, kk * 16), 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(pa);
        fence_regs(dsa);
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
            if (i * 8 >= hd) continue;  // the tile's zero padding past the head dim
            *reinterpret_cast<uint32_t*>(krow + i * 8) = pack_bf16(dk[i][2 * r] * p.scale, dk[i][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t*>(vrow + i * 8) = pack_bf16(dv[i][2 * r], dv[i][2 * r + 1]);
        }
    }
#else
    __trap();  // built without sm_90a; flash_wgmma_supported() keeps this from launching
#endif
}

// kCausal false: bidirectional, key blocks and masks up to each row's document end (key_hi) instead of its position.
template <int D, bool kCausal, bool kFullD>
__global__ void __launch_bounds__(kThreads, 1) flash_bwd_dq_wgmma_kernel(const AttnParams p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    constexpr uint32_t kTile = kBlk * D * 2;
    const uint32_t s_q = base, s_do = base + kTile, s_k = base + 2 * kTile, s_v = base + 4 * kTile;  // K, V: 2 stages

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (p.hq / p.hkv), t = p.t, tk = p.tk;
    const int hd = kFullD ? D : p.d;  // the head dim
    const int64_t qrs = static_cast<int64_t>(p.hq) * hd, krs = static_cast<int64_t>(p.hkv) * hd;
    const int64_t q_off = (static_cast<int64_t>(b) * t * p.hq + h) * hd;
    const int64_t kv_off = (static_cast<int64_t>(b) * tk * p.hkv + kh) * hd;
    const bf16* kg = static_cast<const bf16*>(p.k) + kv_off;
    const bf16* vg = static_cast<const bf16*>(p.v) + kv_off;
    const int m0 = m_block * kBlk, last_row = min(m0 + kBlk, t) - 1;
    // Bidirectional: the block's first and last rows' last keys (and documents); causal: unused.
    const attn_mask::BlockHi bhi = kCausal ? attn_mask::BlockHi{} : attn_mask::block_hi(p, b, m0, last_row);
    const int j0 = attn_mask::first_key_block(p, b, m0, kBlk);
    const int n_blocks = kCausal ? attn_mask::end_key_block(p, last_row, kBlk) : bhi.last / kBlk + 1;
    const float scale_log2 = p.scale * kLog2e;

    load_tile_sw<kBlk, D, kThreads>(s_q, static_cast<const bf16*>(p.q) + q_off, qrs, m0, t, hd, tid);
    load_tile_sw<kBlk, D, kThreads>(s_do, static_cast<const bf16*>(p.dout) + q_off, qrs, m0, t, hd, tid);
    load_tile_sw<kBlk, D, kThreads>(s_k, kg, krs, j0 * kBlk, tk, hd, tid);
    load_tile_sw<kBlk, D, kThreads>(s_v, vg, krs, j0 * kBlk, tk, hd, tid);
    cp_async_commit();

    // delta = rowsum(dO * O) of this block's rows, two threads a row (alternate 8-column pieces of the hd columns)
    // from global memory, kept in shared memory and written out for the dk/dv kernel, which runs after this one.
    const int64_t row_off = (static_cast<int64_t>(b) * p.hq + h) * t;
    float* s_delta = reinterpret_cast<float*>(smem + (base + 6 * kTile - smem_u32(smem)));  // [kBlk]
    {
        const int r = tid / 2;
        float acc = 0.0f;
        if (m0 + r < t) {
            const int64_t off = q_off + static_cast<int64_t>(m0 + r) * qrs;
            const uint4* og = reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.out) + off);
            const uint4* dg = reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.dout) + off);
            // All the row's loads are issued before the first product uses one (a load-use chain per piece left the
            // dq kernel's start latency-bound).
            uint4 ov[D / 16], dv[D / 16];
#pragma unroll
            for (int k = 0; k < D / 16; ++k) {
                const int i = 2 * k + tid % 2;  // the piece of columns [8 i, 8 i + 8); past hd: padding, zero
                const bool in = kFullD || i * 8 < hd;
                ov[k] = in ? og[i] : make_uint4(0, 0, 0, 0);
                dv[k] = in ? dg[i] : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < D / 16; ++k) {
                const uint32_t ow[4] = {ov[k].x, ov[k].y, ov[k].z, ov[k].w};
                const uint32_t dw[4] = {dv[k].x, dv[k].y, dv[k].z, dv[k].w};
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ow[w]));
                    const float2 df = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dw[w]));
                    acc = fmaf(of.x, df.x, acc);
                    acc = fmaf(of.y, df.y, acc);
                }
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (tid % 2 == 0) {
            s_delta[r] = acc;
            if (m0 + r < t) p.delta_w[row_off + m0 + r] = acc;
        }
    }
    __syncthreads();
    const int row0 = m0 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8
    const int pos0 = p.off + row0;               // the key position of row0
    float lse2[2], delta[2];
    int lo[2] = {0, 0};  // the rows' first keys; key blocks starting before the last row's hold masked keys
    const int lo_last = attn_mask::active(p) ? attn_mask::key_lo(p, b, last_row) : 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + r * 8;
        lse2[r] = row < t ? p.lse[row_off + row] * kLog2e : 0.0f;
        delta[r] = s_delta[row - m0];
        if (attn_mask::active(p) && row < t) lo[r] = attn_mask::key_lo(p, b, row);
    }
    // Bidirectional: the rows' last keys (rows >= t: every key, never stored), and the first row's, the smallest.
    int hi[2] = {0, 0}, hi_first = 0;
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) hi[r] = row0 + r * 8 < t ? attn_mask::row_hi(p, b, row0 + r * 8, bhi) : tk - 1;
        hi_first = bhi.first;
    }
    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

    for (int j = j0; j < n_blocks; ++j) {
        const int st = (j - j0) & 1;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // block j is in shared memory, and the products of block j - 1 are done
        if (j + 1 < n_blocks) {
            load_tile_sw<kBlk, D, kThreads>(s_k + (st ^ 1) * kTile, kg, krs, (j + 1) * kBlk, tk, hd, tid);
            load_tile_sw<kBlk, D, kThreads>(s_v + (st ^ 1) * kTile, vg, krs, (j + 1) * kBlk, tk, hd, tid);
        }
        cp_async_commit();
        const uint32_t sk = s_k + st * kTile, sv = s_v + st * kTile;
        const int n0 = j * kBlk;
        const bool edge = n0 + kBlk - 1 > (kCausal ? p.off + m0 : hi_first) || n0 < lo_last;

        // S and dP are separate groups: the exponentials of P run while dP is still on the tensor cores.
        float ps[kBlk / 8][4], ds[kBlk / 8][4], pr[kBlk / 8][4];  // S, dP then dS, P: [64 queries x 64 keys]
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBlk>(ps, desc_k<kBlk>(s_q, 0, kk), desc_k<kBlk>(sk, 0, kk), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBlk>(ds, desc_k<kBlk>(s_do, 0, kk), desc_k<kBlk>(sv, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(ps);
        if (edge)
            dq_probs<true, kCausal>(ps, pr, lse2, lo, hi, pos0, n0, scale_log2, lane);
        else
            dq_probs<false, kCausal>(ps, pr, lse2, lo, hi, pos0, n0, scale_log2, lane);
        wgmma_wait<0>();
        fence_regs(ds);
#pragma unroll
        for (int i = 0; i < kBlk / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) ds[i][e] = pr[i][e] * (ds[i][e] - delta[e / 2]);
        uint32_t dsa[kBlk / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBlk / 16; ++kk) pack_a(dsa[kk], ds, kk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlk / 16; ++kk) wgmma_rs<D>(dq, dsa[kk], desc_mn<kBlk>(sk, kk * 16), 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(dq);
        fence_regs(dsa);
    }

    bf16* dqg = static_cast<bf16*>(p.dq) + q_off;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + r * 8;
        if (row >= t) continue;
        bf16* qrow = dqg + row * qrs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
            if (i * 8 < hd)
                *reinterpret_cast<uint32_t*>(qrow + i * 8) =
                    pack_bf16(dq[i][2 * r] * p.scale, dq[i][2 * r + 1] * p.scale);
    }
#else
    __trap();  // built without sm_90a; flash_wgmma_supported() keeps this from launching
#endif
}

template <int D, bool kCausal, bool kFullD>
void launch_bwd(const AttnParams& p) {
    constexpr int smem = wg_bwd_smem_bytes<D>();
    static const bool configured = [] {
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            flash_bwd_dkdv_wgmma_kernel<D, kCausal, kFullD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            flash_bwd_dq_wgmma_kernel<D, kCausal, kFullD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const unsigned query_blocks = static_cast<unsigned>((p.t + kBlk - 1) / kBlk);
    const unsigned key_blocks = static_cast<unsigned>((p.tk + kBlk - 1) / kBlk);
    flash_bwd_dq_wgmma_kernel<D, kCausal, kFullD>
        <<<dim3(query_blocks, p.hq, p.b), kThreads, smem, core::exec_stream()>>>(p);  // + delta
    MT_CUDA_CHECK(cudaGetLastError());
    flash_bwd_dkdv_wgmma_kernel<D, kCausal, kFullD>
        <<<dim3(key_blocks, p.hkv, p.b), kThreads, smem, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void flash_bwd_wgmma(const AttnParams& p) {
    launch_flash(p, [&](auto d, auto causal) {
        constexpr int kD = decltype(d)::value;
        constexpr bool kCausal = decltype(causal)::value;
        if (p.d == kD)
            launch_bwd<kD, kCausal, true>(p);
        else
            launch_bwd<kD, kCausal, false>(p);
    });
}

}  // namespace mt::ops::cuda
