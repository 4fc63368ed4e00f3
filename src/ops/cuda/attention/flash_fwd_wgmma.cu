// Flash-attention forward on Hopper warpgroup MMA (wgmma, sm_90a), bf16 with D a multiple of 8 up to 128 (tiles of
// 64 or 128 columns, flash_tile_d; TMA fills the columns past the head dim with zeros): the algorithm of
// flash_fwd.cu with two consumer warpgroups per 128 query rows (64 rows each) and key blocks of 128. S = Q K^T is
// m64n128k16 with Q and K read from swizzled shared memory; O += P V is m64nDk16 with P in registers and V read
// transposed from shared memory; each warpgroup overlaps the softmax of one key block with the P V product of the
// one before. A producer warpgroup loads Q, K and V with TMA, K and V into rings guarded by mbarriers, and the two
// consumer warpgroups take turns on the tensor cores (ping-pong). Against the earlier kernel, whose consumers loaded
// with cp.async themselves and met at a block-wide barrier per key block: 0.90 against 1.31 ms at B=8, T=4096,
// H=16, D=128 (docs/PERFORMANCE.md). Bidirectional attention (AttnParams::causal false) is a second instantiation
// (kCausal false).
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention/attention_kernels.h"
#include "ops/cuda/attention/attention_mask.cuh"
#include "ops/cuda/attention/flash_tma.h"
#include "ops/cuda/attention/flash_wgmma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kBM = 64 * kWarpgroups, kBN = 128;

// Reads block S (columns from n0; with kMask, keys after the query's position or before its first key lo are masked;
// pos0 is the position of row0; not kCausal, keys after the row's last key hi instead of its position), folds it into
// the running row max and sum in base 2, and writes P = exp2(S * scale - max) as bf16 A fragments (pk[kk] for columns
// 16 kk .. 16 kk + 15). s is only read, so that ptxas does not serialize the product still accumulating elsewhere.
// Returns in corr the factor by which the rows' earlier output must be scaled. Per element: a max, one FFMA, one exp2,
// one add.
template <bool kMask, bool kCausal, int N>
__device__ __forceinline__ void softmax_block(const float (&s)[N][4],
                                              uint32_t (&pk)[N / 2][4],
                                              float (&row_max)[2],
                                              float (&row_sum)[2],
                                              float (&corr)[2],
                                              const int (&lo)[2],
                                              const int (&hi)[2],
                                              int pos0,
                                              int n0,
                                              float scale_log2,
                                              int lane) {
    auto val = [&](int i, int e) {
        if constexpr (kMask) {
            const int pos = pos0 + (e / 2) * 8, col = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
            if constexpr (!kCausal) return col > hi[e / 2] || col < lo[e / 2] ? -INFINITY : s[i][e];
            return col > pos || col < lo[e / 2] ? -INFINITY : s[i][e];
        } else {
            return s[i][e];
        }
    };
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], val(i, e));
    float neg_max[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = quad_max(mx[r]);
        const float m_new = fmaxf(row_max[r], mx[r] * scale_log2), m_use = attn_mask::safe_max(m_new);
        corr[r] = fast_exp2(row_max[r] - m_use);
        row_max[r] = m_new;
        neg_max[r] = -m_use;
    }
#pragma unroll
    for (int kk = 0; kk < N / 2; ++kk) {
        float pv[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                pv[h][e] = fast_exp2(fmaf(val(2 * kk + h, e), scale_log2, neg_max[e / 2]));
                sum[e / 2] += pv[h][e];
            }
        pk[kk][0] = pack_bf16(pv[0][0], pv[0][1]);
        pk[kk][1] = pack_bf16(pv[0][2], pv[0][3]);
        pk[kk][2] = pack_bf16(pv[1][0], pv[1][1]);
        pk[kk][3] = pack_bf16(pv[1][2], pv[1][3]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * corr[r] + sum[r];
}

// Warp-specialized: a third warpgroup (one thread, 24 registers) loads Q, and K and V in kStages-deep rings, with
// TMA; the two consumer warpgroups wait on mbarriers per stage and release each stage as soon as their products have
// read it, so neither waits on the other at a block-wide barrier and no consumer instruction goes to loads. The
// consumers take turns to issue their products (ping-pong, named barriers 1 and 2), so that one warpgroup's softmax
// runs while the other's products hold the tensor cores. kCausal false: bidirectional (attention_mask.cuh), the key
// blocks and masks end at each row's document end (key_hi) instead of its position; the causal instantiation is the
// kernel as it was.
template <int D, int kStages, bool kCausal>
__global__ void __launch_bounds__(kThreads + 128, 1) flash_fwd_tma_kernel(const __grid_constant__ CUtensorMap tm_q,
                                                                          const __grid_constant__ CUtensorMap tm_k,
                                                                          const __grid_constant__ CUtensorMap tm_v,
                                                                          const AttnParams p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    constexpr uint32_t kQBytes = kBM * D * 2, kKVBytes = kBN * D * 2;
    const uint32_t s_q = base, s_k = base + kQBytes, s_v = s_k + kStages * kKVBytes;
    // mbarriers: Q full; K full, K empty, V full, V empty [kStages] each.
    const uint32_t bar_q = s_v + kStages * kKVBytes, k_full = bar_q + 8, k_empty = k_full + 8 * kStages,
                   v_full = k_empty + 8 * kStages, v_empty = v_full + 8 * kStages;
    constexpr int kConsumerWarps = kThreads / 32;

    const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (p.hq / p.hkv), t = p.t;
    const int m0 = m_block * kBM, last_row = min(m0 + kBM, t) - 1;
    // Bidirectional: the block's first and last rows' last keys (and documents); causal: unused.
    const attn_mask::BlockHi bhi = kCausal ? attn_mask::BlockHi{} : attn_mask::block_hi(p, b, m0, last_row);
    // Key blocks j0 + j for j < n_blocks: from the first row's first key to the diagonal, the block of the last row's
    // position (attention_mask.cuh); bidirectional, to the block of the last row's last key.
    const int j0 = attn_mask::first_key_block(p, b, m0, kBN);
    const int n_blocks = (kCausal ? attn_mask::end_key_block(p, last_row, kBN) : bhi.last / kBN + 1) - j0;

    if (threadIdx.x == 0) {
        mbar_init(bar_q, 1);
        for (int st = 0; st < kStages; ++st) {
            mbar_init(k_full + 8 * st, 1);
            mbar_init(v_full + 8 * st, 1);
            mbar_init(k_empty + 8 * st, kConsumerWarps);
            mbar_init(v_empty + 8 * st, kConsumerWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // the producer warpgroup
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            auto load_kv = [&](const CUtensorMap* map, uint32_t tiles, uint32_t full, uint32_t empty, int j) {
                const int st = j % kStages;
                ring_wait_released<kStages>(empty, j);
                mbar_expect_tx(full + 8 * st, kKVBytes);
                tma_load_tile<D>(tiles + st * kKVBytes, map, full + 8 * st, kBN, kh, (j0 + j) * kBN, b);
            };
            mbar_expect_tx(bar_q, kQBytes);
            tma_load_tile<D>(s_q, &tm_q, bar_q, kBM, h, m0, b);
            load_kv(&tm_k, s_k, k_full, k_empty, 0);
            for (int j = 0; j < n_blocks; ++j) {  // in the order the consumers need them: K_{j+1} before V_j
                if (j + 1 < n_blocks) load_kv(&tm_k, s_k, k_full, k_empty, j + 1);
                load_kv(&tm_v, s_v, v_full, v_empty, j);
            }
        }
        return;
    }
    setmaxnreg_inc<240>();

    const int wg = threadIdx.x / 128 - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int row0 = m0 + wg * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8
    const int pos0 = p.off + row0;                         // the key position of row0
    const float scale_log2 = p.scale * kLog2e;
    int lo[2] = {0, 0};  // the rows' first keys
    int lo_last = 0;     // the block's last row's: key blocks starting before it hold masked keys of some row
    if (attn_mask::active(p)) {
        for (int r = 0; r < 2; ++r) lo[r] = row0 + r * 8 < t ? attn_mask::key_lo(p, b, row0 + r * 8) : 0;
        lo_last = attn_mask::key_lo(p, b, last_row);
    }
    // Bidirectional: the rows' last keys (rows >= t see every key: they are never stored), and the first row's, the
    // smallest (key_hi never decreases along the rows), which every block ending after it crosses. Causal: unused.
    int hi[2] = {0, 0}, hi_first = 0;
    if constexpr (!kCausal) {
        for (int r = 0; r < 2; ++r) hi[r] = row0 + r * 8 < t ? attn_mask::row_hi(p, b, row0 + r * 8, bhi) : p.tk - 1;
        hi_first = bhi.first;
    }
    // Block j needs the mask: one ending after the first row's position (the diagonal, which with a key prefix may
    // cross two blocks; bidirectional: after the first row's last key, keys >= tk among them), or one starting before
    // some row's first key.
    auto edge = [&](int j) {
        if constexpr (!kCausal) return (j0 + j + 1) * kBN - 1 > hi_first || (j0 + j) * kBN < lo_last;
        return (j0 + j + 1) * kBN - 1 > p.off + m0 || (j0 + j) * kBN < lo_last;
    };
    // After the warp's wgmma wait, one lane frees the stage for the producer.
    auto release = [&](uint32_t empty, int j) {
        if (lane == 0) mbar_arrive(empty + 8 * (j % kStages));
    };
    // Ping-pong: warpgroup w issues its products after bar.sync on barrier 1 + w and then lets the other one go.
    // Warpgroup 1 opens with an arrive on warpgroup 0's barrier and skips the arrive after its last products, so
    // that every barrier sees as many arrives as syncs.
    auto turn_begin = [&] { named_bar_sync(1 + wg, kThreads); };
    auto turn_end = [&](bool last) {
        if (!(last && wg == 1)) named_bar_arrive(2 - wg, kThreads);
    };
    if (wg == 1) named_bar_arrive(1, kThreads);

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, corr[2];
    float s[kBN / 8][4];
    uint32_t pa[kBN / 16][4];

    mbar_wait(bar_q, 0);
    ring_wait_filled<kStages>(k_full, 0);
    turn_begin();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBN>(s, desc_k<kBM>(s_q, wg * 64, kk), desc_k<kBN>(s_k, 0, kk), kk);
    wgmma_commit();
    turn_end(false);
    wgmma_wait<0>();
    fence_regs(s);
    release(k_empty, 0);
    if (edge(0))
        softmax_block<true, kCausal>(s, pa, row_max, row_sum, corr, lo, hi, pos0, j0 * kBN, scale_log2, lane);
    else
        softmax_block<false, kCausal>(s, pa, row_max, row_sum, corr, lo, hi, pos0, j0 * kBN, scale_log2, lane);

    // Key block j < n_blocks - 1: pa holds P_j. S_{j+1} is issued before P_j V_j, and its softmax runs while P_j V_j
    // is on the tensor cores. kMask: block j + 1 is an edge block (without a document map or window, one of the last
    // two).
    auto step = [&](int j, auto mask) {
        constexpr bool kMask = decltype(mask)::value;
        ring_wait_filled<kStages>(k_full, j + 1);
        ring_wait_filled<kStages>(v_full, j);
        const uint32_t sk = s_k + ((j + 1) % kStages) * kKVBytes, sv = s_v + (j % kStages) * kKVBytes;
        turn_begin();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBN>(s, desc_k<kBM>(s_q, wg * 64, kk), desc_k<kBN>(sk, 0, kk), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) wgmma_rs<D>(o, pa[kk], desc_mn<kBN>(sv, kk * 16), 1);
        wgmma_commit();
        turn_end(false);
        wgmma_wait<1>();  // S_{j+1} is done; P_j V_j may still run
        fence_regs(s);
        release(k_empty, j + 1);
        uint32_t pn[kBN / 16][4];  // P_{j+1}, in registers apart from pa, which P_j V_j is still reading
        softmax_block<kMask, kCausal>(
            s, pn, row_max, row_sum, corr, lo, hi, pos0, (j0 + j + 1) * kBN, scale_log2, lane);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
        release(v_empty, j);
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            o[i][0] *= corr[0];
            o[i][1] *= corr[0];
            o[i][2] *= corr[1];
            o[i][3] *= corr[1];
        }
        // A plain copy would let ptxas merge pn with pa (and then serialize the products to keep pa intact); the xor
        // with a value it cannot see to be 0 keeps them apart.
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[kk][e] = pn[kk][e] ^ p.zero;
    };
    int j = 0;
    for (; j + 1 < n_blocks; ++j) {
        if (edge(j + 1))
            step(j, std::true_type{});
        else
            step(j, std::false_type{});
    }
    ring_wait_filled<kStages>(v_full, j);
    turn_begin();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
        wgmma_rs<D>(o, pa[kk], desc_mn<kBN>(s_v + (j % kStages) * kKVBytes, kk * 16), 1);
    wgmma_commit();
    turn_end(true);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    store_output<D>(p, o, row_max, row_sum, b, h, row0, lane);
#else
    __trap();  // built without sm_90a; flash_wgmma_supported() keeps this from launching
#endif
}

template <int D, int kStages, bool kCausal>
void launch_fwd_tma(const AttnParams& p) {
    constexpr int smem = (kBM + 2 * kStages * kBN) * D * static_cast<int>(sizeof(bf16)) + 8 * (1 + 4 * kStages) + 1024;
    static const bool configured = [] {
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            flash_fwd_tma_kernel<D, kStages, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const CUtensorMap tm_q = make_bthd_tensor_map(p.q, p.b, p.t, p.hq, p.d, kBM);
    const CUtensorMap tm_k = make_bthd_tensor_map(p.k, p.b, p.tk, p.hkv, p.d, kBN);
    const CUtensorMap tm_v = make_bthd_tensor_map(p.v, p.b, p.tk, p.hkv, p.d, kBN);
    const dim3 grid((p.t + kBM - 1) / kBM, p.hq, p.b);
    flash_fwd_tma_kernel<D, kStages, kCausal><<<grid, kThreads + 128, smem, core::exec_stream()>>>(tm_q, tm_k, tm_v, p);
    MT_CUDA_CHECK(cudaGetLastError());
}

// Always the ping-pong schedule: 0.90 against 0.94 ms without it on the H200 (B=8, T=4096, H=16, D=128; the
// cp.async kernel this replaced took 1.31).
template <int D, bool kCausal>
void launch_fwd(const AttnParams& p) {
    launch_fwd_tma<D, 2, kCausal>(p);
}

}  // namespace

bool flash_wgmma_supported() {
    static const bool ok = wgmma_kernel_runs(reinterpret_cast<const void*>(flash_fwd_tma_kernel<128, 2, true>));
    return ok;
}

void flash_fwd_wgmma(const AttnParams& p) {
    launch_flash(p, [&](auto d, auto causal) { launch_fwd<decltype(d)::value, decltype(causal)::value>(p); });
}

}  // namespace mt::ops::cuda
