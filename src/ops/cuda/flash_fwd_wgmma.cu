// Flash-attention forward on Hopper warpgroup MMA (wgmma, sm_90a), bf16 with D in {64, 128}: the algorithm of
// flash_fwd.cu with one thread block of two warpgroups per 128 query rows (64 rows each) and key blocks of 128.
// S = Q K^T is m64n128k16 with Q and K read from swizzled shared memory; O += P V is m64nDk16 with P in registers
// and V read transposed from shared memory. K and V are double-buffered by cp.async, the next block's load overlapping
// the current block's products and softmax.
#include <cuda_bf16.h>

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
    const int m0 = m_block * kBM;
    const int n_blocks = (min(m0 + kBM, t) - 1) / kBN + 1;
    const float scale_log2 = p.scale * kLog2e;

    load_tile_sw<kBM, D, kThreads>(s_q, qg, qrs, m0, t, tid);
    load_tile_sw<kBN, D, kThreads>(s_k, kg, krs, 0, t, tid);
    load_tile_sw<kBN, D, kThreads>(s_v, vg, krs, 0, t, tid);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
    const int row0 = m0 + wg * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8

    for (int j = 0; j < n_blocks; ++j) {
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // block j is in shared memory, and every warpgroup is done with block j - 1
        if (j + 1 < n_blocks) {
            const uint32_t st = ((j + 1) & 1) * kKVBytes;
            load_tile_sw<kBN, D, kThreads>(s_k + st, kg, krs, (j + 1) * kBN, t, tid);
            load_tile_sw<kBN, D, kThreads>(s_v + st, vg, krs, (j + 1) * kBN, t, tid);
        }
        cp_async_commit();
        const uint32_t sk = s_k + (j & 1) * kKVBytes, sv = s_v + (j & 1) * kKVBytes;

        float s[kBN / 8][4];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) wgmma_ss<kBN>(s, desc_k<kBM>(s_q, wg * 64, kk), desc_k<kBN>(sk, 0, kk), kk);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(s);

        const int n0 = j * kBN;
        const bool diagonal = n0 + kBN - 1 > m0 + wg * 64;
#pragma unroll
        for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + (e / 2) * 8, col = n0 + i * 8 + (lane % 4) * 2 + (e % 2);
                s[i][e] = diagonal && col > row ? -INFINITY : s[i][e] * scale_log2;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) mx = fmaxf(mx, fmaxf(s[i][2 * r], s[i][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float corr = fast_exp2(row_max[r] - mx);
            row_max[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < kBN / 8; ++i) {
                s[i][2 * r] = fast_exp2(s[i][2 * r] - mx);
                s[i][2 * r + 1] = fast_exp2(s[i][2 * r + 1] - mx);
                sum += s[i][2 * r] + s[i][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                o[i][2 * r] *= corr;
                o[i][2 * r + 1] *= corr;
            }
        }
        uint32_t pa[kBN / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) pack_a(pa[kk], s, kk);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) wgmma_rs<D>(o, pa[kk], desc_mn<kBN>(sv, kk * 16), 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_regs(o);
        fence_regs(pa);
    }

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
