// Tensor-core products over the value dimension of the KDA backward chunk step (kda.md §4.6 steps 2 and 4), for the
// inputs kda::use_tc accepts. Per (chunk, unit), with h the state entering the chunk and dS the gradient of the state
// leaving it (both [K, V]):
//   dQg = dO h^T,  dKg = Vn dS^T,  dW = -dVn h^T  (each [C, K], into the chunk kernel's fp32 scratch),
//   dA = tril(dO Vn^T)  ([C, C]),  dgl_x = gamma_x sum_y h_xy dS_xy  (the last row's state term of dGamma).
// These were the fp32 chunk kernel's dominant loops (one warp per output, rows of h and dS re-read from global
// memory for every output). Here the value dimension is walked in slabs of 32 columns, double-buffered through
// cp.async; every warp owns fixed output tiles (TF32 mma.sync, fp32 accumulation, fixed k order): deterministic.
// Persistent blocks (one per SM, 16 warps) walk their chunks with the slab pipeline running across chunk ends.
// dO is staged in its own dtype: bf16 and f16 values are exact in TF32. h and Vn come in fp32 (H = float: the
// backward's own scan, or KdaOptions::save_states) or bf16 (H = bf16, save_states_bf16: staged as 16-bit, exact TF32
// operands). fp32 Vn arrives rounded to TF32 (the scans store it so), so it too is read as bits; fp32 h, dS and dVn
// are rounded at each fragment (dgl sums h dS exactly, and the backward's chunk step needs dVn exact).
#include <type_traits>

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace {

constexpr int kSlab = 32;        // value columns per stage
constexpr int kLdS = kSlab + 4;  // fp32 row stride (4 mod 32)
constexpr int kLdO = kSlab + 8;  // 16-bit row stride in elements (rows stay 16-byte aligned)

// Row stride of a staged h or Vn slab of element type H.
template <typename H>
inline constexpr int kLdState = sizeof(H) == 4 ? kLdS : kLdO;
// One stage, in bytes from its start: dO [c, kLdO] (T), Vn [c] (H), dVn [c, kLdS] (fp32), h [K] (H), dS [K, kLdS]
// (fp32); the H rows of stride kLdState<H>. With H = float this is the fp32 layout the kernel had before bf16 states.
template <typename T, typename H>
struct StageLayout {
    int vn, dvn, h, ds, bytes;
    __host__ __device__ explicit StageLayout(const Dims& d) {
        constexpr int hb = static_cast<int>(sizeof(H)), fb = static_cast<int>(sizeof(float));
        vn = d.c * kLdO * static_cast<int>(sizeof(T));
        dvn = vn + d.c * kLdState<H> * hb;
        h = dvn + d.c * kLdS * fb;
        ds = h + d.k * kLdState<H> * hb;
        bytes = ds + d.k * kLdS * fb;
    }
};

// An element of a staged h or Vn slab as a TF32 operand: bf16 is exact; fp32 h is rounded (kRound), fp32 Vn already
// holds TF32 bits.
template <bool kRound>
__device__ __forceinline__ uint32_t state_operand(float x) {
    return kRound ? to_tf32(x) : __float_as_uint(x);
}
template <bool kRound>
__device__ __forceinline__ uint32_t state_operand(bf16 x) {
    return tf32_exact(x);
}

constexpr int kMmWarps = 16;
constexpr int kMmThreads = kMmWarps * 32;

template <typename T, typename H, bool kModel>
__global__ void __launch_bounds__(kMmThreads, 1) chunk_mm_tc_kernel(const T* __restrict__ dout,
                                                                    Dims dims,
                                                                    Work w,
                                                                    const H* __restrict__ hs,
                                                                    const H* __restrict__ vns,
                                                                    const float* __restrict__ dvns,
                                                                    const float* __restrict__ dhs,
                                                                    float* __restrict__ dqg,
                                                                    float* __restrict__ dkg,
                                                                    float* __restrict__ dw,
                                                                    float* __restrict__ da,
                                                                    float* __restrict__ dgl) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const Dims d = model_dims<kModel>(dims);
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int64_t kv = static_cast<int64_t>(kd) * vd, chunks = static_cast<int64_t>(d.units()) * d.nc;
    const StageLayout<T, H> lay(d);
    const int bytes = lay.bytes, slabs = vd / kSlab;
    constexpr int ldh = kLdState<H>;
    auto sdo = [&](int s) { return reinterpret_cast<T*>(smem_raw + s * bytes); };
    auto svn = [&](int s) { return reinterpret_cast<H*>(smem_raw + s * bytes + lay.vn); };
    auto sdvn = [&](int s) { return reinterpret_cast<float*>(smem_raw + s * bytes + lay.dvn); };
    auto sh = [&](int s) { return reinterpret_cast<H*>(smem_raw + s * bytes + lay.h); };
    auto sds = [&](int s) { return reinterpret_cast<float*>(smem_raw + s * bytes + lay.ds); };
    // Slab i of the block's sequence: chunk blockIdx.x + (i / slabs) * gridDim.x, value columns (i % slabs) * kSlab.
    auto load = [&](int s, int64_t cb, int y0) {
        const int unit = static_cast<int>(cb / d.nc), n = static_cast<int>(cb % d.nc);
        const int b = unit / d.hv, hv = unit % d.hv, t0 = n * c;
        constexpr int per = kSlab * static_cast<int>(sizeof(T)) / 16;  // 16-byte copies per dO row
        for (int e = tid; e < c * per; e += kMmThreads) {
            const int r = e / per, q = e % per, tok = t0 + r;
            const bool ok = tok < d.t;
            const T* src = dout + v_row(d, b, ok ? tok : 0, hv) + y0 + q * (16 / static_cast<int>(sizeof(T)));
            cp_async16_zfill(sdo(s) + r * kLdO + q * (16 / static_cast<int>(sizeof(T))), src, ok);
        }
        stage_async<kMmThreads>(svn(s), ldh, vns + cv_off(d, cb) + y0, vd, c, kSlab);
        stage_async<kMmThreads>(sdvn(s), kLdS, dvns + cv_off(d, cb) + y0, vd, c, kSlab);
        stage_async<kMmThreads>(sh(s), ldh, hs + cb * kv + y0, vd, kd, kSlab);
        stage_async<kMmThreads>(sds(s), kLdS, dhs + cb * kv + y0, vd, kd, kSlab);
    };
    // Warp tiles: row tile mi (c = 32 idles warps with mi >= 2), key-column tiles nq + 4 j, dA column tiles
    // nq + 4 j below the diagonal.
    const int mi = warp & 3, nq = warp >> 2, m0 = mi * 16;
    const bool rows = m0 < c;
    const int ntk = kd / 8;
    float aq[4][4], ak[4][4], aw[4][4], aa[2][4];
    float gl = 0.0f;  // sum_y h_xy dS_xy for x = tid < K
    auto zero = [&] {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) aq[j][e] = ak[j][e] = aw[j][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) aa[j][e] = 0.0f;
        gl = 0.0f;
    };
    zero();
    const int first = static_cast<int>(blockIdx.x), stride = static_cast<int>(gridDim.x);
    if (first >= chunks) return;
    const int total = (static_cast<int>(chunks) - first + stride - 1) / stride * slabs;  // this block's slabs
    load(0, first, 0);
    cp_async_commit();
    for (int i = 0; i < total; ++i) {
        const int s = i & 1, sl = i % slabs;
        const int64_t cb = first + (i / slabs) * stride;
        if (i + 1 < total) load(s ^ 1, first + ((i + 1) / slabs) * stride, ((i + 1) % slabs) * kSlab);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const T* o = sdo(s);
        const H *pv = svn(s), *ph = sh(s);
        const float *pdv = sdvn(s), *pds = sds(s);
        if (tid < kd)
            for (int y = 0; y < kSlab; ++y) gl += to_f32(ph[tid * ldh + y]) * pds[tid * kLdS + y];
        if (rows) {
#pragma unroll
            for (int k0 = 0; k0 < kSlab; k0 += 8) {
                uint32_t ao[4], av[4], adv[4];
                ao[0] = tf32_exact(o[(m0 + g) * kLdO + k0 + t]);
                ao[1] = tf32_exact(o[(m0 + g + 8) * kLdO + k0 + t]);
                ao[2] = tf32_exact(o[(m0 + g) * kLdO + k0 + t + 4]);
                ao[3] = tf32_exact(o[(m0 + g + 8) * kLdO + k0 + t + 4]);
                av[0] = state_operand<false>(pv[(m0 + g) * ldh + k0 + t]);
                av[1] = state_operand<false>(pv[(m0 + g + 8) * ldh + k0 + t]);
                av[2] = state_operand<false>(pv[(m0 + g) * ldh + k0 + t + 4]);
                av[3] = state_operand<false>(pv[(m0 + g + 8) * ldh + k0 + t + 4]);
                frag_a(adv, pdv, kLdS, m0, k0, g, t);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int x0 = (nq + 4 * j) * 8;
                    if (nq + 4 * j < ntk) {
                        uint32_t bh[2], bs[2];
                        bh[0] = state_operand<true>(ph[(x0 + g) * ldh + k0 + t]);
                        bh[1] = state_operand<true>(ph[(x0 + g) * ldh + k0 + t + 4]);
                        frag_bt(bs, pds, kLdS, k0, x0, g, t);
                        mma_tf32(aq[j], ao, bh);
                        mma_tf32(aw[j], adv, bh);
                        mma_tf32(ak[j], av, bs);
                    }
                }
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int j0 = (nq + 4 * j) * 8;
                    if (j0 < m0 + 16) {
                        uint32_t bv[2];
                        bv[0] = state_operand<false>(pv[(j0 + g) * ldh + k0 + t]);
                        bv[1] = state_operand<false>(pv[(j0 + g) * ldh + k0 + t + 4]);
                        mma_tf32(aa[j], ao, bv);
                    }
                }
            }
        }
        __syncthreads();  // stage s is refilled by the next iteration's load
        if (sl != slabs - 1) continue;
        // The chunk's last slab: write its results, then start the next chunk's sums.
        if (tid < kd) dgl[cb * kd + tid] = expf(w.gam[ck_off(d, cb) + static_cast<int64_t>(c - 1) * kd + tid]) * gl;
        if (rows) {
            const int r0 = m0 + g, c0 = 2 * t;
            const int64_t ob = ck_off(d, cb);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int x = (nq + 4 * j) * 8 + c0;
                if (nq + 4 * j < ntk) {
                    const int64_t i0 = ob + static_cast<int64_t>(r0) * kd + x, i1 = i0 + 8 * kd;
                    *reinterpret_cast<float2*>(dqg + i0) = make_float2(aq[j][0], aq[j][1]);
                    *reinterpret_cast<float2*>(dqg + i1) = make_float2(aq[j][2], aq[j][3]);
                    *reinterpret_cast<float2*>(dkg + i0) = make_float2(ak[j][0], ak[j][1]);
                    *reinterpret_cast<float2*>(dkg + i1) = make_float2(ak[j][2], ak[j][3]);
                    *reinterpret_cast<float2*>(dw + i0) = make_float2(-aw[j][0], -aw[j][1]);
                    *reinterpret_cast<float2*>(dw + i1) = make_float2(-aw[j][2], -aw[j][3]);
                }
            }
            // Every entry of dA, the zeros above the diagonal included (the buffer may be fresh).
            float* pa = da + cc_off(d, cb);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int j0 = (nq + 4 * j) * 8, x = j0 + c0;
                if (j0 >= c) continue;
                const bool on = j0 < m0 + 16;
                pa[r0 * c + x] = on && x <= r0 ? aa[j][0] : 0.0f;
                pa[r0 * c + x + 1] = on && x + 1 <= r0 ? aa[j][1] : 0.0f;
                pa[(r0 + 8) * c + x] = on && x <= r0 + 8 ? aa[j][2] : 0.0f;
                pa[(r0 + 8) * c + x + 1] = on && x + 1 <= r0 + 8 ? aa[j][3] : 0.0f;
            }
        }
        zero();
    }
}

// One launch of chunk_mm_tc_kernel for dO of type T, with h and Vn of the states' dtype. bf16 states come only with
// 16-bit inputs (the tensor-core path), so the fp32-input build has no bf16-state kernel.
template <typename T>
void chunk_mm_typed(const Tensor& dout,
                    const Dims& d,
                    const Work& w,
                    const StatesIn& states,
                    const float* dvn,
                    const float* dhs,
                    float* dqg,
                    float* dkg,
                    float* dw,
                    float* da,
                    float* dgl,
                    dim3 grid) {
    auto launch = [&](const auto* hs, const auto* vn) {
        using H = std::remove_cv_t<std::remove_pointer_t<decltype(hs)>>;
        const size_t smem = 2 * static_cast<size_t>(StageLayout<T, H>(d).bytes);
        with_model_shape(d, [&](auto model) {
            const auto kernel = chunk_mm_tc_kernel<T, H, decltype(model)::value>;
            MT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
            kernel<<<grid, kMmThreads, smem, core::exec_stream()>>>(
                static_cast<const T*>(dout.raw()), d, w, hs, vn, dvn, dhs, dqg, dkg, dw, da, dgl);
        });
    };
    if constexpr (!std::is_same_v<T, float>) {
        if (states.hs16 != nullptr) return launch(states.hs16, states.vn16);
    }
    launch(states.hs, states.vn);
}

}  // namespace

bool chunk_tc_shapes(const Dims& d) {
    return d.v % kSlab == 0;
}

void chunk_mm_tc_launch(const Tensor& dout,
                        const Dims& d,
                        const Work& w,
                        const StatesIn& states,
                        const float* dvn,
                        const float* dhs,
                        float* dqg,
                        float* dkg,
                        float* dw,
                        float* da,
                        float* dgl) {
    // Persistent: one block per SM walks its chunks, so the next chunk's first slab loads during this one's last.
    static const int sms = device_attr(cudaDevAttrMultiProcessorCount);
    const int64_t chunks = static_cast<int64_t>(d.units()) * d.nc;
    const dim3 grid(static_cast<unsigned>(chunks < sms ? chunks : sms));
    MT_CUDA_DISPATCH(
        dout.dtype(), T, { chunk_mm_typed<T>(dout, d, w, states, dvn, dhs, dqg, dkg, dw, da, dgl, grid); });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::ops::cuda::kda
