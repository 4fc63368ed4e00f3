// The 5-matmul flash-attention backward on Hopper warpgroup MMA (wgmma, sm_90a), bf16 with D a
// multiple of 8 up to 128 (tiles of 64 or 128 columns, flash_tile_d; TMA zero-fills past the head dim), in the manner
// of FlashAttention-2/3: 5 matmuls. One thread block per 128 keys: two consumer warpgroups (64 keys each) loop over the
// GQA group's query heads and the query blocks of 64: S^T = K Q^T and dP^T = V dO^T read both operands from swizzled
// shared memory, dV += P^T dO and dK += dS^T Q take P^T and dS^T from registers, and dS^T goes to shared memory, from
// which dQ = dS K (each warpgroup half of D, over all 128 keys) is computed. The dQ block goes to a double-buffered
// shared chunk, and a third warpgroup (few registers) adds it to an fp32 buffer with one bulk reduction
// (cp.reduce.async.bulk .add.f32, 32 KB) from one thread, so the consumers never wait on the global adds. Unordered
// (kOrdered false, run.deterministic off) the sum's order depends on scheduling. Ordered (the deterministic backward)
// the key blocks that see a query block add to its sums in descending key order, taking turns on a counter per query
// block (FlashAttention-3's deterministic mode): the writer waits for its turn before the reduction, waits for the
// reduction to complete after it, and passes the turn on, while the consumers go on into the other dq buffer. A key
// block's turn on query block m comes after every later key block that sees m; the grid runs the key blocks in
// descending order, so each one waits only on blocks started before it (no deadlock however many keys), and (causal,
// no prefix) the one it waits on is two query blocks ahead of it, so the waits are short. The same warpgroup loads: K,
// V, and each query block's Q and dO with TMA into kStages-deep rings guarded by mbarriers (lse and delta by one warp),
// so the consumers meet only once per query block, where each needs the other's dS^T rows (double-buffered). A
// pre-kernel computes delta = rowsum(dO * O); a post-kernel writes dq = buffer * scale in bf16. attention.cu runs it
// ordered when core::exec().deterministic is on, unordered when off (docs/PERFORMANCE.md has the figures). With a key
// prefix (Tk > T) the key blocks cover all Tk keys, a block no query sees writing zeros, and the edge tests compare
// positions (attention_mask.cuh). Bidirectional attention (AttnParams::causal false) is a second instantiation of the
// kernel (kCausal false).
#include <cuda_bf16.h>

#include "core/cuda/cuda_check.h"
#include "core/error.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/attention/flash_tma.h"
#include "ops/cuda/attention/flash_wgmma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

// kWarpgroups consumer warpgroups per thread block, 64 keys each (one warpgroup over 64 keys doubles the dq sums and
// ran 1.8x slower); query blocks of kBM.
constexpr int kWarpgroups = 2, kBM = 64, kStages = 2;

// Each warpgroup sums dq columns [wg D / 2, (wg + 1) D / 2) of a query block: a chunk of kBM x D / 2 floats.
template <int D>
__host__ __device__ constexpr int dq_chunk_bytes() {
    return kBM * (D / kWarpgroups) * static_cast<int>(sizeof(float));
}

template <int D>
constexpr int fast_bwd_smem_bytes() {
    // K, V [64 kWarpgroups][D]; Q, dO [kStages][kBM][D]; dS^T [2 buffers][64 kWarpgroups][kBM] (bf16); dq chunks
    // [2 buffers][kWarpgroups]; lse, delta [kStages][kBM] (f32); mbarriers (dq full [2][kWarpgroups], dq empty [2],
    // K/V, Q full [kStages], Q empty [kStages]); alignment. 231,512 bytes at D = 128, below the 232,448 limit.
    return (2 * 64 * kWarpgroups * D + 2 * kStages * kBM * D + 2 * 64 * kWarpgroups * kBM) *
               static_cast<int>(sizeof(bf16)) +
           2 * kWarpgroups * dq_chunk_bytes<D>() + 2 * kStages * kBM * static_cast<int>(sizeof(float)) +
           8 * (2 * kWarpgroups + 3 + 2 * kStages) + 1024;
}

// Rows = this warpgroup's 64 keys, columns = 64 queries from m0: P^T = exp2(S^T * scale - lse) in place in pt.
// kMask (a block with queries positioned before some key, >= t, or whose first key is after some key): those give 0.
// kCausal false (bidirectional): the queries of another document than the key's (kdoc: attention_mask.cuh doc_of, -1
// for keys >= tk) or >= t give 0.
template <bool kMask, bool kCausal>
__device__ __forceinline__ void fast_probs(float (&pt)[kBM / 8][4],
                                           const float* slse,
                                           const AttnParams& p,
                                           int b,
                                           int key0,
                                           const int (&kdoc)[2],
                                           int m0,
                                           int t,
                                           float scale_log2,
                                           int lane) {
#pragma unroll
    for (int i = 0; i < kBM / 8; ++i) {
        const int qc = i * 8 + (lane % 4) * 2;
        const float2 l = *reinterpret_cast<const float2*>(slse + qc);
        const float nl[2] = {-l.x * kLog2e, -l.y * kLog2e};
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
        }
    }
}

// kCausal false: bidirectional (attention_mask.cuh: query_blocks lists the key block's documents' queries); the causal
// instantiation is the kernel as it was.
template <int D, bool kCausal, bool kOrdered>
__global__ void __launch_bounds__(128 * (kWarpgroups + 1), 1)
    flash_bwd_fast_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q,
                                const __grid_constant__ CUtensorMap tm_k,
                                const __grid_constant__ CUtensorMap tm_v,
                                const __grid_constant__ CUtensorMap tm_do,
                                const AttnParams p) {
#if MT_WGMMA_ENABLED
    constexpr int kThreads = 128 * kWarpgroups, kBN = 64 * kWarpgroups;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    constexpr uint32_t kKV = kBN * D * 2, kQ = kBM * D * 2, kDs = kBN * kBM * 2;
    const uint32_t s_k = base, s_v = base + kKV, s_q = base + 2 * kKV, s_do = s_q + kStages * kQ;
    constexpr uint32_t kDqChunk = dq_chunk_bytes<D>();
    const uint32_t s_ds = s_do + kStages * kQ;  // [2][kBN keys][kBM]
    const uint32_t s_dq = s_ds + 2 * kDs;       // [2][kWarpgroups][kDqChunk]
    float* s_lse = reinterpret_cast<float*>(smem + (s_dq + 2 * kWarpgroups * kDqChunk - smem_u32(smem)));
    float* s_delta = s_lse + kStages * kBM;  // [kStages][kBM], after lse [kStages][kBM]
    // dq buffer b: full (a consumer warpgroup wrote its chunk) and empty (the writer's reductions have read it).
    // full [2 buffers][kWarpgroups], empty [2 buffers]. Then K/V loaded; Q stage st full (Q, dO, lse and delta are
    // in) and empty (the consumers are done with it).
    const uint32_t bar_full = smem_u32(s_delta + kStages * kBM), bar_empty = bar_full + 8 * 2 * kWarpgroups;
    const uint32_t bar_kv = bar_empty + 8 * 2, q_full = bar_kv + 8, q_empty = q_full + 8 * kStages;

    // Warpgroup 0: thread 0 is the dq writer (the bulk reductions), thread 32 the loader (TMA), warp 2 loads lse and
    // delta. Warpgroups 1 .. kWarpgroups are the consumers (wg below counts from 0 for them).
    const int wg_raw = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; ++i) {
            for (int w = 0; w < kWarpgroups; ++w) mbar_init(bar_full + 8 * (i * kWarpgroups + w), 128);
            mbar_init(bar_empty + 8 * i, 1);
        }
        mbar_init(bar_kv, 1);
        for (int st = 0; st < kStages; ++st) {
            mbar_init(q_full + 8 * st, 1 + 32);  // the TMA thread's expect_tx and the lse/delta warp's lanes
            mbar_init(q_empty + 8 * st, kThreads / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int wg = wg_raw - 1, tw = threadIdx.x % 128, warp = tw / 32, lane = threadIdx.x % 32;
    // The key blocks of one (batch, head) are the fastest grid index, so that the thread blocks running at once share
    // few heads and their Q, dO and dq sums stay in L2 (with the heads fastest, the backward took 4.49 ms instead of
    // 4.21 at B=8, T=4096, H=16, D=128); key block 0 (the most query blocks) starts first, or last when ordered.
    const int n_block = kOrdered ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x) : blockIdx.x,
              kh = blockIdx.y % p.hkv, b = blockIdx.y / p.hkv, t = p.t, tk = p.tk;
    const int group = p.hq / p.hkv;
    const int64_t krs = static_cast<int64_t>(p.hkv) * p.d;
    const int64_t kv_off = (static_cast<int64_t>(b) * tk * p.hkv + kh) * p.d;
    const int n0 = n_block * kBN;
    // The query blocks from the diagonal (row 0 for a prefix key) to the key block's last viewer (attention_mask.cuh);
    // none for a prefix block no query sees, whose dK and dV are then zeros.
    const int m_blocks = (t + kBM - 1) / kBM;
    int first_q, end_q;
    attn_mask::query_blocks(p, b, n0, kBN, kBM, &first_q, &end_q);
    const int q_blocks = end_q - first_q, iters = group * q_blocks;
    const float scale_log2 = p.scale * kLog2e;
    auto head_of = [&](int it) { return kh * group + it / q_blocks; };
    auto row0_of = [&](int it) { return (first_q + it % q_blocks) * kBM; };

    // Warpgroup 0 takes few registers, so that the consumers get 240 (24 + 2 x 240 fill the 168 x 384 of the launch):
    // without setmaxnreg the consumers need 254 and warpgroup 0 would not fit.
    if (wg_raw == 0) {
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            for (int it = 0; it < iters; ++it) {
                const int mb = first_q + it % q_blocks, sl = it % 2;
                const int64_t tile = (static_cast<int64_t>(b) * p.hq + head_of(it)) * m_blocks + mb;
                float* g = p.dq_accum + tile * (kBM * D);
                if constexpr (kOrdered) {
                    // The key blocks that see query block mb are a run ending at the block of the last key its last
                    // row sees (attention_mask.cuh: both ends of a key block's query range never decrease).
                    const int last_row = min((mb + 1) * kBM, t) - 1;
                    const int n_last = min(attn_mask::key_hi(p, b, last_row) / kBN, static_cast<int>(gridDim.x) - 1);
                    wait_turn(p.dq_turn + tile, n_last - n_block);
                    fence_proxy_async_global();  // the reductions below come after the turn was seen
                }
                for (int w = 0; w < kWarpgroups; ++w) {  // each chunk as soon as its warpgroup is done
                    mbar_wait(bar_full + 8 * (sl * kWarpgroups + w), (it / 2) & 1);
                    bulk_reduce_add_f32<kDqChunk>(g + w * (kDqChunk / 4), s_dq + (sl * kWarpgroups + w) * kDqChunk);
                }
                bulk_commit();
                if constexpr (kOrdered) {
                    bulk_wait<0>();  // the sums are in global memory before the next key block's turn
                    fence_proxy_async_global();
                    red_release_gpu_add(p.dq_turn + tile, 1);
                } else {
                    bulk_wait_read<0>();  // the chunk may be overwritten
                }
                mbar_arrive(bar_empty + 8 * sl);
            }
            bulk_wait<0>();
        } else if (threadIdx.x == 32) {  // K and V even when iters = 0: the consumers wait for them
            mbar_expect_tx(bar_kv, 2 * kKV);
            tma_load_tile<D>(s_k, &tm_k, bar_kv, kBN, kh, n0, b);
            tma_load_tile<D>(s_v, &tm_v, bar_kv, kBN, kh, n0, b);
            for (int it = 0; it < iters; ++it) {
                const int st = it % kStages;
                ring_wait_released<kStages>(q_empty, it);
                mbar_expect_tx(q_full + 8 * st, 2 * kQ);
                tma_load_tile<D>(s_q + st * kQ, &tm_q, q_full + 8 * st, kBM, head_of(it), row0_of(it), b);
                tma_load_tile<D>(s_do + st * kQ, &tm_do, q_full + 8 * st, kBM, head_of(it), row0_of(it), b);
            }
        } else if (warp == 2) {
            for (int it = 0; it < iters; ++it) {
                const int st = it % kStages, m0 = row0_of(it);
                const int64_t row_off = (static_cast<int64_t>(b) * p.hq + head_of(it)) * t;
                ring_wait_released<kStages>(q_empty, it);
#pragma unroll
                for (int r = lane; r < kBM; r += 32) {
                    const bool in = m0 + r < t;
                    s_lse[st * kBM + r] = in ? p.lse[row_off + m0 + r] : 0.0f;
                    s_delta[st * kBM + r] = in ? p.delta[row_off + m0 + r] : 0.0f;
                }
                mbar_arrive(q_full + 8 * st);
            }
        }
        return;
    }
    setmaxnreg_inc<240>();

    constexpr int kDqN = D / kWarpgroups;  // dq columns of this warpgroup: [wg kDqN, (wg + 1) kDqN)
    static_assert(kDqN == 32 || kDqN == 64, "no wgmma for this many dq columns");
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    const int kr = wg * 64 + warp * 16 + lane / 4;  // this thread's keys in the block: kr and kr + 8
    const int key0 = n0 + kr;
    int kdoc[2] = {0, 0};  // bidirectional: the keys' documents (-1 past tk: no query's)
    int key_doc = -1;      // bidirectional: the block's one document (block_doc), or -1
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) kdoc[r] = key0 + r * 8 < tk ? attn_mask::doc_of(p, b, key0 + r * 8) : -1;
        key_doc = attn_mask::block_doc(p, b, n0, kBN);
    }
    const int dq_col0 = wg * kDqN;

    mbar_wait(bar_kv, 0);
    for (int it = 0; it < iters; ++it) {
        const int st = it % kStages;
        ring_wait_filled<kStages>(q_full, it);
        const uint32_t sq = s_q + st * kQ, sdo = s_do + st * kQ, sds = s_ds + (it % 2) * kDs;
        const int m0 = row0_of(it);
        // Bidirectional: every pair is seen when all the block's keys and queries are of one document.
        const bool edge = kCausal ? p.off + m0 < n0 + kBN || m0 + kBM > t ||
                                        (attn_mask::active(p) && attn_mask::key_lo(p, b, min(m0 + kBM, t) - 1) > n0)
                                  : !attn_mask::bidir_tile_full(p, b, m0, kBM, key_doc);

        float pt[kBM / 8][4], dpt[kBM / 8][4];  // S^T then P^T; dP^T then dS^T: [64 keys x 64 queries]
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_ss<kBM>(pt, desc_k<kBN>(s_k, wg * 64, kk), desc_k<kBM>(sq, 0, kk), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_ss<kBM>(dpt, desc_k<kBN>(s_v, wg * 64, kk), desc_k<kBM>(sdo, 0, kk), kk);
        wgmma_commit();
        wgmma_wait<1>();  // S^T is done: its exponentials run while dP^T is still on the tensor cores
        fence_regs(pt);
        if (edge)
            fast_probs<true, kCausal>(pt, s_lse + st * kBM, p, b, key0, kdoc, m0, t, scale_log2, lane);
        else
            fast_probs<false, kCausal>(pt, s_lse + st * kBM, p, b, key0, kdoc, m0, t, scale_log2, lane);
        wgmma_wait<0>();
        fence_regs(dpt);
        const float* sdelta = s_delta + st * kBM;
#pragma unroll
        for (int i = 0; i < kBM / 8; ++i) {  // dS^T = P^T (dP^T - delta)
            const float2 dl = *reinterpret_cast<const float2*>(sdelta + i * 8 + (lane % 4) * 2);
            dpt[i][0] = pt[i][0] * (dpt[i][0] - dl.x);
            dpt[i][1] = pt[i][1] * (dpt[i][1] - dl.y);
            dpt[i][2] = pt[i][2] * (dpt[i][2] - dl.x);
            dpt[i][3] = pt[i][3] * (dpt[i][3] - dl.y);
        }
        uint32_t pa[kBM / 16][4], dsa[kBM / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) {
            pack_a(pa[kk], pt, kk);
            pack_a(dsa[kk], dpt, kk);
        }
        // dS^T rows kr, kr + 8 into the swizzled [kBN][64] tile: columns 16 kk .. 16 kk + 15 are dsa[kk].
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = kr + r * 8;
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int ch = 2 * kk + hf;
                    const uint32_t addr = sds + row * 128 + ((ch ^ (row % 8)) * 16) + (lane % 4) * 4;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(dsa[kk][2 * hf + r]) : "memory");
                }
            }
        fence_proxy_async();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) wgmma_rs<D>(dv, pa[kk], desc_mn<kBM>(sdo, kk * 16), 1);
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) wgmma_rs<D>(dk, dsa[kk], desc_mn<kBM>(sq, kk * 16), 1);
        wgmma_commit();
        asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");  // dS^T of every warpgroup is in shared memory

        // dQ[64 queries x kDqN] = dS K over the kBN keys: A = dS^T tile read MN-major, B = K read MN-major.
        const uint32_t s_kc = s_k + (dq_col0 / 64) * (kBN * 128) + (dq_col0 % 64) * 2;
        float dq[kDqN / 8][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk)
            wgmma_ss<kDqN, 1, 1>(dq,
                                 make_desc(sds + kk * 16 * 128, kBN * 128, 1024),
                                 make_desc(s_kc + kk * 16 * 128, kBN * 128, 1024),
                                 kk);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dv);
        fence_regs(dk);
        fence_regs(pa);
        fence_regs(dsa);
        fence_regs(dq);
        if (lane == 0) mbar_arrive(q_empty + 8 * st);  // Q, dO, lse and delta of stage st are no longer read
        // The accumulator goes to shared memory as it lies in the registers (float4 i of thread tw at i * 128 + tw:
        // conflict-free) and from there, through the writer's bulk reduction, to this warpgroup's contiguous chunk of
        // the buffer; the post-kernel knows the order.
        const int sl = it % 2;
        if (it >= 2) mbar_wait(bar_empty + 8 * sl, (it / 2 - 1) & 1);  // the reduction of it - 2 has read slot sl
        const uint32_t buf = s_dq + (sl * kWarpgroups + wg) * kDqChunk;
#pragma unroll
        for (int i = 0; i < kDqN / 8; ++i)
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(buf + (i * 128 + tw) * 16),
                         "f"(dq[i][0]),
                         "f"(dq[i][1]),
                         "f"(dq[i][2]),
                         "f"(dq[i][3])
                         : "memory");
        fence_proxy_async();
        mbar_arrive(bar_full + 8 * (sl * kWarpgroups + wg));
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
#else
    __trap();  // built without sm_90a; flash_wgmma_supported() keeps this from launching
#endif
}

// delta[b, h, i] = rowsum(dO * O) of row (b, i, h), D / 8 threads a row (8 elements each; those past p.d add 0).
template <int D>
__global__ void flash_bwd_fast_pre_kernel(const AttnParams p, int64_t rows) {
    constexpr int kPerRow = D / 8;
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t row = g / kPerRow;
    const int c = static_cast<int>(g % kPerRow) * 8;
    float acc = 0.0f;
    if (row < rows && c < p.d) {
        const int64_t off = row * p.d + c;
        const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.out) + off);
        const uint4 dv = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.dout) + off);
        const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w}, dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&ow[w]));
            const float2 df = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&dw[w]));
            acc = fmaf(of.x, df.x, acc);
            acc = fmaf(of.y, df.y, acc);
        }
    }
#pragma unroll
    for (int s = 1; s < kPerRow; s *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (row < rows && g % kPerRow == 0) {
        const int h = static_cast<int>(row % p.hq);
        const int64_t bi = row / p.hq, i = bi % p.t, bb = bi / p.t;
        p.delta_w[(bb * p.hq + h) * p.t + i] = acc;
    }
}

// dq = dq_accum * scale in bf16, one float4 of the buffer a thread. The buffer holds [B][Hq][query block][warpgroup]
// chunks, each in the register order of the kernel: float4 i * 128 + tw is dq[i][0..3] of thread tw of the
// warpgroup, i.e. rows r and r + 8 (r = 16 warp + lane / 4) and columns c, c + 1 (c = 8 i + 2 (lane % 4)).
template <int D>
__global__ void flash_bwd_fast_post_kernel(const AttnParams p, int64_t n4, int m_blocks) {
    constexpr int kChunk4 = dq_chunk_bytes<D>() / 16;
    const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= n4) return;
    const float4 x = reinterpret_cast<const float4*>(p.dq_accum)[g];
    const int64_t c = g / kChunk4;
    const int j = static_cast<int>(g % kChunk4), i = j / 128, tw = j % 128, wg = static_cast<int>(c % kWarpgroups);
    const int64_t tile = c / kWarpgroups, bh = tile / m_blocks;
    const int row = static_cast<int>(tile % m_blocks) * kBM + (tw / 32) * 16 + (tw % 32) / 4;
    const int col = wg * (D / kWarpgroups) + i * 8 + (tw % 4) * 2;
    const int h = static_cast<int>(bh % p.hq);
    const int64_t bb = bh / p.hq;
    if (col >= p.d) return;  // the tile's zero padding past the head dim
    bf16* out = static_cast<bf16*>(p.dq) + ((bb * p.t + row) * p.hq + h) * p.d + col;
    if (row < p.t) *reinterpret_cast<uint32_t*>(out) = pack_bf16(x.x * p.scale, x.y * p.scale);
    if (row + 8 < p.t)
        *reinterpret_cast<uint32_t*>(out + 8 * static_cast<int64_t>(p.hq) * p.d) =
            pack_bf16(x.z * p.scale, x.w * p.scale);
}

template <int D, bool kCausal, bool kOrdered>
void launch_bwd_fast(const AttnParams& p) {
    constexpr int smem = fast_bwd_smem_bytes<D>();
    static const bool configured = [] {
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            flash_bwd_fast_wgmma_kernel<D, kCausal, kOrdered>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const int64_t rows = static_cast<int64_t>(p.b) * p.t * p.hq;
    MT_CUDA_CHECK(
        cudaMemsetAsync(p.dq_accum, 0, flash_bwd_wgmma_fast_accum_floats(p) * sizeof(float), core::exec_stream()));
    if constexpr (kOrdered) {
        MT_CHECK(p.dq_turn != nullptr, "flash_bwd_wgmma_fast: the ordered backward needs its turn counters");
        MT_CUDA_CHECK(cudaMemsetAsync(p.dq_turn, 0, flash_bwd_wgmma_fast_turns(p) * sizeof(int), core::exec_stream()));
    }
    constexpr int kPreThreads = 256;
    const int64_t pre_threads = rows * (D / 8);
    flash_bwd_fast_pre_kernel<D>
        <<<static_cast<unsigned>((pre_threads + kPreThreads - 1) / kPreThreads), kPreThreads, 0, core::exec_stream()>>>(
            p, rows);
    MT_CUDA_CHECK(cudaGetLastError());
    const dim3 grid(static_cast<unsigned>((p.tk + 64 * kWarpgroups - 1) / (64 * kWarpgroups)),
                    static_cast<unsigned>(p.b * p.hkv));
    const CUtensorMap tm_q = make_bthd_tensor_map(p.q, p.b, p.t, p.hq, p.d, kBM);
    const CUtensorMap tm_do = make_bthd_tensor_map(p.dout, p.b, p.t, p.hq, p.d, kBM);
    const CUtensorMap tm_k = make_bthd_tensor_map(p.k, p.b, p.tk, p.hkv, p.d, 64 * kWarpgroups);
    const CUtensorMap tm_v = make_bthd_tensor_map(p.v, p.b, p.tk, p.hkv, p.d, 64 * kWarpgroups);
    flash_bwd_fast_wgmma_kernel<D, kCausal, kOrdered>
        <<<grid, 128 * (kWarpgroups + 1), smem, core::exec_stream()>>>(tm_q, tm_k, tm_v, tm_do, p);
    MT_CUDA_CHECK(cudaGetLastError());
    const int m_blocks = (p.t + kBM - 1) / kBM;
    const int64_t n4 = static_cast<int64_t>(p.b) * p.hq * m_blocks * kBM * D / 4;
    flash_bwd_fast_post_kernel<D>
        <<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, core::exec_stream()>>>(p, n4, m_blocks);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t flash_bwd_wgmma_fast_accum_floats(const AttnParams& p) {
    return static_cast<size_t>(p.b) * p.hq * ((p.t + kBM - 1) / kBM) * kBM * flash_tile_d(p.d);
}

size_t flash_bwd_wgmma_fast_turns(const AttnParams& p) {
    return static_cast<size_t>(p.b) * p.hq * ((p.t + kBM - 1) / kBM);
}

void flash_bwd_wgmma_fast(const AttnParams& p, bool ordered) {
    launch_flash(p, [&](auto d, auto causal) {
        constexpr int kD = decltype(d)::value;
        constexpr bool kCausal = decltype(causal)::value;
        if (ordered)
            launch_bwd_fast<kD, kCausal, true>(p);
        else
            launch_bwd_fast<kD, kCausal, false>(p);
    });
}

}  // namespace mt::ops::cuda
