// Flash-attention forward (FlashAttention-2 algorithm) on tensor cores, bf16 with D a multiple of 8 up to 128 (on tiles
// of 64 or 128 columns, flash_tile_d): one thread block
// per (query block of kBM rows, query head, batch row); each warp owns 16 query rows and keeps its output rows in
// fp32 registers while it walks the key blocks from its first row's first key (attention_mask.cuh) up to the diagonal
// (the block holding its last row's position; with a key prefix of Tk - T keys, query i sits at position Tk - T + i).
// K and V blocks are double-buffered in shared memory by cp.async; S = Q K^T and O += P V are mma.sync m16n8k16; the
// softmax is online in base 2. The T x T score matrix never exists. Saves lse [B, Hq, T] (natural log) for the
// backward, and writes the rows' max scaled score (max_logit) when asked for, from the running max it keeps anyway.
// Bidirectional (AttnParams::causal false) is its own instantiation: the key blocks and the mask end at each row's
// document end (attention_mask.cuh key_hi) instead of its position.
#include <cuda_bf16.h>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/attention/flash_common.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

constexpr int kWarps = 4, kThreads = kWarps * 32, kBM = 16 * kWarps, kBN = 64;

template <int D>
constexpr int fwd_smem_bytes() {
    return (kBM + 4 * kBN) * (D + 8) * static_cast<int>(sizeof(bf16));
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 2) flash_fwd_kernel(const AttnParams p) {
    constexpr int kLds = D + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* s_q = reinterpret_cast<bf16*>(smem);  // [kBM][kLds]
    bf16* s_k = s_q + kBM * kLds;               // [2][kBN][kLds]
    bf16* s_v = s_k + 2 * kBN * kLds;           // [2][kBN][kLds]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (p.hq / p.hkv), t = p.t, tk = p.tk;
    const int dh = p.d;  // the tensors' head dim (<= D, the tile width)
    const int64_t qrs = static_cast<int64_t>(p.hq) * dh, krs = static_cast<int64_t>(p.hkv) * dh;
    const bf16* qg = static_cast<const bf16*>(p.q) + (static_cast<int64_t>(b) * t * p.hq + h) * dh;
    const bf16* kg = static_cast<const bf16*>(p.k) + (static_cast<int64_t>(b) * tk * p.hkv + kh) * dh;
    const bf16* vg = static_cast<const bf16*>(p.v) + (static_cast<int64_t>(b) * tk * p.hkv + kh) * dh;
    const int m0 = m_block * kBM;
    const int last_row = min(m0 + kBM, t) - 1;
    // Bidirectional: the block's first and last rows' last keys (and documents); causal: unused.
    const attn_mask::BlockHi bhi = kCausal ? attn_mask::BlockHi{} : attn_mask::block_hi(p, b, m0, last_row);
    const int j0 = attn_mask::first_key_block(p, b, m0, kBN);
    const int n_blocks = kCausal ? attn_mask::end_key_block(p, last_row, kBN) : bhi.last / kBN + 1;
    // Key blocks starting before the last row's first key hold masked keys of some row.
    const int lo_last = attn_mask::active(p) ? attn_mask::key_lo(p, b, last_row) : 0;
    const float scale_log2 = p.scale * kLog2e;

    load_tile<kBM, D, kThreads>(s_q, qg, qrs, m0, t, dh, tid);
    load_tile<kBN, D, kThreads>(s_k, kg, krs, j0 * kBN, tk, dh, tid);
    load_tile<kBN, D, kThreads>(s_v, vg, krs, j0 * kBN, tk, dh, tid);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    uint32_t qa[D / 16][4];
    const int row0 = m0 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8
    const int pos0 = p.off + row0;               // the key position of row0
    int lo[2] = {0, 0};                          // their first keys
    if (attn_mask::active(p))
        for (int r = 0; r < 2; ++r) lo[r] = row0 + r * 8 < t ? attn_mask::key_lo(p, b, row0 + r * 8) : 0;
    // Bidirectional: the rows' last keys (rows >= t see every key: they are never stored), and the first row's, the
    // smallest (key_hi never decreases along the rows). Causal: unused.
    int hi[2] = {0, 0}, hi_first = 0;
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) hi[r] = row0 + r * 8 < t ? attn_mask::row_hi(p, b, row0 + r * 8, bhi) : tk - 1;
        hi_first = bhi.first;
    }

    for (int j = j0; j < n_blocks; ++j) {
        if (j + 1 < n_blocks) {
            const int st = (j + 1 - j0) & 1;
            load_tile<kBN, D, kThreads>(s_k + st * kBN * kLds, kg, krs, (j + 1) * kBN, tk, dh, tid);
            load_tile<kBN, D, kThreads>(s_v + st * kBN * kLds, vg, krs, (j + 1) * kBN, tk, dh, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (j == j0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) load_a(qa[kk], s_q, kLds, warp * 16, kk * 16, lane);
        }
        const bf16* sk = s_k + ((j - j0) & 1) * kBN * kLds;
        const bf16* sv = s_v + ((j - j0) & 1) * kBN * kLds;

        float s[kBN / 8][4];
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
            for (int nb = 0; nb < kBN / 16; ++nb) {
                uint32_t kb[4];
                load_b_nk(kb, sk, kLds, nb * 16, kk * 16, lane);
                mma_16816(s[2 * nb], qa[kk], kb[0], kb[1]);
                mma_16816(s[2 * nb + 1], qa[kk], kb[2], kb[3]);
            }
        }

        // Scale to base 2, mask keys after the query's position (blocks ending after the first row's position hold
        // every such key, and keys >= Tk) and before its first key (blocks starting before the last row's first key).
        // Bidirectional: after the row's last key (blocks ending after the first row's last key hold every such key).
        const int n0 = j * kBN;
        const bool edge = n0 + kBN - 1 > (kCausal ? p.off + m0 : hi_first) || n0 < lo_last;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int pos = kCausal ? pos0 + (e / 2) * 8 : hi[e / 2], col = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
                s[i][e] = edge && (col > pos || col < lo[e / 2]) ? -INFINITY : s[i][e] * scale_log2;
            }
        }
        // Online softmax: rows are spread over the 4 lanes of a quad.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) mx = fmaxf(mx, fmaxf(s[i][2 * r], s[i][2 * r + 1]));
            mx = quad_max(mx);
            const float m_use = attn_mask::safe_max(mx);
            const float corr = fast_exp2(row_max[r] - m_use);
            row_max[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
                s[i][2 * r] = fast_exp2(s[i][2 * r] - m_use);
                s[i][2 * r + 1] = fast_exp2(s[i][2 * r + 1] - m_use);
                sum += s[i][2 * r] + s[i][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                o[i][2 * r] *= corr;
                o[i][2 * r + 1] *= corr;
            }
        }
        // O += P V (P from registers, V through ldmatrix.trans).
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) {
            uint32_t pa[4];
            pack_a(pa, s, kk);
#pragma unroll
            for (int db = 0; db < D / 16; ++db) {
                uint32_t vb[4];
                load_b_kn(vb, sv, kLds, kk * 16, db * 16, lane);
                mma_16816(o[2 * db], pa, vb[0], vb[1]);
                mma_16816(o[2 * db + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();  // every warp is done with this stage before the next iteration refills it
    }

    store_output<D>(p, o, row_max, row_sum, b, h, row0, lane);
}

template <int D, bool kCausal>
void launch_fwd(const AttnParams& p) {
    constexpr int smem = fwd_smem_bytes<D>();
    static const bool configured = [] {
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(flash_fwd_kernel<D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const dim3 grid((p.t + kBM - 1) / kBM, p.hq, p.b);
    flash_fwd_kernel<D, kCausal><<<grid, kThreads, smem, core::exec_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void flash_fwd(const AttnParams& p) {
    launch_flash(p, [&](auto d, auto causal) { launch_fwd<decltype(d)::value, decltype(causal)::value>(p); });
}

}  // namespace mt::ops::cuda
