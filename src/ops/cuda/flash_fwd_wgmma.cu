// Flash-attention forward on Hopper warpgroup MMA (wgmma, sm_90a), bf16 with D in {64, 128}: the algorithm of
// flash_fwd.cu with one thread block of two warpgroups per 128 query rows (64 rows each) and key blocks of 128.
// S = Q K^T is m64n128k16 with Q and K read from swizzled shared memory; O += P V is m64nDk16 with P in registers
// and V read transposed from shared memory. K and V are double-buffered by cp.async, the loads running ahead of the
// products, and each warpgroup overlaps the softmax of one key block with the P V product of the one before.
#include <cuda_bf16.h>

#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "ops/cuda/attention_kernels.h"
#include "ops/cuda/flash_wgmma.cuh"

namespace mt::ops::cuda {

namespace {

using namespace flash;

constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kBM = 64 * kWarpgroups, kBN = 128;

template <int D>
constexpr int wg_fwd_smem_bytes() {
    return (kBM + 4 * kBN) * D * static_cast<int>(sizeof(bf16)) + 1024;  // + room to align to 1024
}

// Reads block S (columns from n0; with kMask, keys after the query are masked), folds it into the running row max
// and sum in base 2, and writes P = exp2(S * scale - max) as bf16 A fragments (pk[kk] for columns 16 kk .. 16 kk + 15).
// s is only read, so that ptxas does not serialize the product still accumulating elsewhere. Returns in corr the
// factor by which the rows' earlier output must be scaled. Per element: a max, one FFMA, one exp2, one add.
template <bool kMask, int N>
__device__ __forceinline__ void softmax_block(const float (&s)[N][4],
                                              uint32_t (&pk)[N / 2][4],
                                              float (&row_max)[2],
                                              float (&row_sum)[2],
                                              float (&corr)[2],
                                              int row0,
                                              int n0,
                                              float scale_log2,
                                              int lane) {
    auto val = [&](int i, int e) {
        if constexpr (kMask) {
            const int row = row0 + (e / 2) * 8, col = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
            return col > row ? -INFINITY : s[i][e];
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
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(row_max[r], mx[r] * scale_log2);
        corr[r] = fast_exp2(row_max[r] - m_new);
        row_max[r] = m_new;
        neg_max[r] = -m_new;
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

// Software pipeline per warpgroup: while the tensor cores compute O += P_j V_j, the warps run the softmax of
// S_{j+1} = Q K_{j+1}^T (issued just before), so the exponentials overlap the second product.
template <int D>
__global__ void __launch_bounds__(kThreads, 1) flash_fwd_wgmma_kernel(const AttnParams p) {
#if MT_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    constexpr uint32_t kQBytes = kBM * D * 2, kKVBytes = kBN * D * 2;
    const uint32_t s_q = base, s_k = base + kQBytes, s_v = s_k + 2 * kKVBytes;  // K, V: [2 stages]

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int m_block = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (p.hq / p.hkv), t = p.t;
    const int64_t qrs = static_cast<int64_t>(p.hq) * D, krs = static_cast<int64_t>(p.hkv) * D;
    const bf16* qg = static_cast<const bf16*>(p.q) + (static_cast<int64_t>(b) * t * p.hq + h) * D;
    const bf16* kg = static_cast<const bf16*>(p.k) + (static_cast<int64_t>(b) * t * p.hkv + kh) * D;
    const bf16* vg = static_cast<const bf16*>(p.v) + (static_cast<int64_t>(b) * t * p.hkv + kh) * D;
    const int m0 = m_block * kBM, wg_row0 = m0 + wg * 64;
    const int n_blocks = (min(m0 + kBM, t) - 1) / kBN + 1;
    const float scale_log2 = p.scale * kLog2e;
    // Key block j is in K stage j % 2 and V stage j % 2.
    auto load_k = [&](int j) { load_tile_sw<kBN, D, kThreads>(s_k + (j & 1) * kKVBytes, kg, krs, j * kBN, t, tid); };
    auto load_v = [&](int j) { load_tile_sw<kBN, D, kThreads>(s_v + (j & 1) * kKVBytes, vg, krs, j * kBN, t, tid); };

    load_tile_sw<kBM, D, kThreads>(s_q, qg, qrs, m0, t, tid);
    load_k(0);
    load_v(0);
    if (n_blocks > 1) load_k(1);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f}, corr[2];
    const int row0 = wg_row0 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8

    // Prologue: S_0 and its softmax.
    float s[kBN / 8][4];
    uint32_t pa[kBN / 16][4];
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBN>(s, desc_k<kBM>(s_q, wg * 64, kk), desc_k<kBN>(s_k, 0, kk), kk);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);
    if (n_blocks == 1)
        softmax_block<true>(s, pa, row_max, row_sum, corr, row0, 0, scale_log2, lane);
    else
        softmax_block<false>(s, pa, row_max, row_sum, corr, row0, 0, scale_log2, lane);

    // Key block j < n_blocks - 1: pa holds P_j; K_{j+1} and V_j are arriving. After the barrier every warpgroup is
    // done with S_j (K stage j % 2) and with P_{j-1} V_{j-1} (V stage (j + 1) % 2), so those stages take K_{j+2} and
    // V_{j+1}. S_{j+1} is issued before P_j V_j, and its softmax runs while P_j V_j is on the tensor cores. Only the
    // last block (j + 1 = n_blocks - 1) holds keys after some query (kMask).
    auto step = [&](int j, auto mask) {
        constexpr bool kMask = decltype(mask)::value;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        if (j + 2 < n_blocks) load_k(j + 2);
        load_v(j + 1);
        cp_async_commit();
        const uint32_t sk = s_k + ((j + 1) & 1) * kKVBytes, sv = s_v + (j & 1) * kKVBytes;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBN>(s, desc_k<kBM>(s_q, wg * 64, kk), desc_k<kBN>(sk, 0, kk), kk);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) wgmma_rs<D>(o, pa[kk], desc_mn<kBN>(sv, kk * 16), 1);
        wgmma_commit();
        wgmma_wait<1>();  // S_{j+1} is done; P_j V_j may still run
        fence_regs(s);
        uint32_t pn[kBN / 16][4];  // P_{j+1}, in registers apart from pa, which P_j V_j is still reading
        softmax_block<kMask>(s, pn, row_max, row_sum, corr, row0, (j + 1) * kBN, scale_log2, lane);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);
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
    for (; j + 2 < n_blocks; ++j) step(j, std::false_type{});
    if (j + 1 < n_blocks) step(j++, std::true_type{});
    // The last block: O += P V only.
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wgmma_rs<D>(o, pa[kk], desc_mn<kBN>(s_v + (j & 1) * kKVBytes, kk * 16), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);

    bf16* og = static_cast<bf16*>(p.out_w) + (static_cast<int64_t>(b) * t * p.hq + h) * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = row_sum[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row0 + r * 8;
        if (row >= t) continue;
        const float inv = 1.0f / l;
        bf16* orow = og + row * qrs + (lane % 4) * 2;
#pragma unroll
        for (int i = 0; i < D / 8; ++i)
            *reinterpret_cast<uint32_t*>(orow + i * 8) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        if (lane % 4 == 0) p.lse[(static_cast<int64_t>(b) * p.hq + h) * t + row] = (row_max[r] + log2f(l)) * kLn2;
    }
#else
    __trap();  // built without sm_90a; flash_wgmma_supported() keeps this from launching
#endif
}

template <int D>
void launch_fwd(const AttnParams& p) {
    constexpr int smem = wg_fwd_smem_bytes<D>();
    static const bool configured = [] {
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(flash_fwd_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        return true;
    }();
    (void)configured;
    const dim3 grid((p.t + kBM - 1) / kBM, p.hq, p.b);
    flash_fwd_wgmma_kernel<D><<<grid, kThreads, smem, core::cuda_stream()>>>(p);
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool flash_wgmma_supported() {
    static const bool ok = [] {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess) return false;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
        cudaFuncAttributes attr{};
        if (cudaFuncGetAttributes(&attr, flash_fwd_wgmma_kernel<128>) != cudaSuccess) return false;
        return major == 9 && attr.binaryVersion == 90;
    }();
    return ok;
}

void flash_fwd_wgmma(const AttnParams& p) {
    if (p.d == 64)
        launch_fwd<64>(p);
    else
        launch_fwd<128>(p);
}

}  // namespace mt::ops::cuda
