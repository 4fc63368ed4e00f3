// The KDA backward chunk step (kda.md §4.6 steps 4-6) as one block per (chunk, unit) whose operands all sit in
// shared memory, for the inputs of the tensor-core path (kda::use_chunk_tc) at K = V = 128. It replaces, for those
// chunks, chunk_kernel's dt_tc / tdt_tc / elementwise / intra_tc / cumsum phases, which read every MMA fragment
// from the fp32 workspace in global memory and kept dq, dk, dGamma there between phases (9.6 ms at 8 x 4096).
//
// Inputs: T, dA (from chunk_mm_tc), dW and dVn (the chunk scratch), Gamma, q, k, v, beta, staged once by cp.async;
// dQg, dKg (chunk scratch) and M are read where they are used, once each. Phases (16 warps):
//   1. dT = dW Xw^T + dVn Xu^T, only its tiles that reach dL (the strictly lower part: dL = -strict_tril(T^T dT T^T)
//      involves dT_lm for l > m only), Xw = Diag(beta) k e^Gamma rebuilt from k, Gamma, beta; dXu = T^T dVn by value
//      column group, dv = beta dXu straight to global memory.
//   2. T^T dT, then dL, then dbeta's L term and dM = Diag(beta) dL.
//   3. A warp per 16 key channels and half the row tiles: dXw = T^T dW, the elementwise factors, the intra-chunk
//      terms (kda_intra_tc.cuh's anchored tile products, operands from shared memory, each A fragment serving two
//      8-channel groups), and dq, dk stored; the reverse cumsum of dGamma inside each tile by shuffles, then across
//      tiles through shared memory, and dg stored.
// The loops over tiles and k-steps are kept rolled: the kernel's code (~100 KB of SASS) must fit the SM's
// instruction cache; the unrolled version (158 KB) ran each phase slower (3.87 vs 3.38 ms at 8 x 4096).
// Products are 3xTF32 (kda::bwd_split_tc) like the kernels they replace; each output element has one owner lane and
// a fixed summation order: deterministic. A chunk with a 16-row tile outside the anchors' bound (anchor_ok: Gamma's
// spread plus the log of the largest |q|, |k|; only the unbounded gate or q, k far above the layer's unit norm reach
// it) is left to chunk_kernel: this kernel marks it in `fallback` and writes nothing else for it.
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/kda_intra_tc.cuh"
#include "ops/cuda/kda_mma.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace {

constexpr int kWarps = 16;
constexpr int kBlock = kWarps * 32;

// The head sizes of the kernel: the model's K = V = 128, compile-time so that every stride and offset below is an
// immediate (with runtime K and V the kernel needed ~40 more registers and spilled at 512 threads).
constexpr int kK = 128, kV = 128;

// Shared-memory layout (strides in elements). Padded strides keep the fragment reads free of bank conflicts or at
// most two-way: c + 8 for T (read transposed), c + 4 for the [c, c] tiles read both ways, K/V + 4 for dW and dVn
// (row reads), K + 8 for Gamma, q, k, v (the intra products read them transposed).
template <int kC>
struct Layout {
    static constexpr int ldt = kC + 8, ldc = kC + 4, ldw = kK + 4, ldv = kV + 4, ldg = kK + 8, ldh = kK + 8;
    static constexpr int t_off = 0;
    static constexpr int a_off = t_off + kC * ldt;
    static constexpr int d_off = a_off + kC * ldc;
    static constexpr int w_off = d_off + kC * ldc;
    static constexpr int v_off = w_off + kC * ldw;
    // dVn, then T^T dT, then the low TF32 parts of dA and dM
    static constexpr int g_off = v_off + kC * (ldv > 2 * ldc ? ldv : 2 * ldc);
    // beta, dbeta's L term, the last row's dGamma term [K], dbeta partial sums [2, warps, c]
    static constexpr int misc_off = g_off + kC * ldg;
    static constexpr int h_off = misc_off + 2 * kMaxChunk + kK + 2 * kWarps * kMaxChunk + (kC / 16 + 2) * kK;
    static constexpr size_t bytes = static_cast<size_t>(h_off) * sizeof(float) + 3 * static_cast<size_t>(kC) * ldh * 2;
    static_assert(bytes <= 227 * 1024, "chunk_smem_kernel's tiles exceed the shared memory of a block");
};

template <typename T>
__device__ __forceinline__ void store_pair(T* p, float a, float b) {
    *reinterpret_cast<typename Pair<T>::type*>(p) = Pair<T>::from(a, b);
}

// Rows [t0, t0 + c) of a [B, T, heads, width] 2-byte tensor into shared memory (stride ld), zeros past T.
template <typename T>
__device__ __forceinline__ void stage_rows(
    T* dst, int ld, const T* src, const Dims& d, int b, int t0, int heads, int head, int width) {
    const int per = width * 2 / 16;
    for (int e = threadIdx.x; e < d.c * per; e += blockDim.x) {
        const int r = e / per, q = e % per, tok = t0 + r;
        const bool ok = tok < d.t;
        const T* s = src + ((static_cast<int64_t>(b) * d.t + (ok ? tok : 0)) * heads + head) * width + q * 8;
        cp_async16_zfill(dst + r * ld + q * 8, s, ok);
    }
}

template <typename T, bool kSplit, int kC>
__global__ void __launch_bounds__(kBlock, 1) chunk_smem_kernel(const T* __restrict__ q,
                                                               const T* __restrict__ k,
                                                               const T* __restrict__ v,
                                                               const T* __restrict__ beta,
                                                               Dims d,
                                                               Work w,
                                                               const float* __restrict__ dvns,
                                                               const float* __restrict__ dqgs,
                                                               const float* __restrict__ dkgs,
                                                               const float* __restrict__ dws,
                                                               const float* __restrict__ dgls,
                                                               float* __restrict__ dqh,
                                                               float* __restrict__ dkh,
                                                               T* __restrict__ dq,
                                                               T* __restrict__ dk,
                                                               T* __restrict__ dv,
                                                               T* __restrict__ dg,
                                                               T* __restrict__ dbeta,
                                                               int* __restrict__ fallback,
                                                               PhaseClock pc) {
    extern __shared__ __align__(16) float sm[];
    using L = Layout<kC>;
    constexpr int c = kC, nsub = kC / 16, nct = kC / 8, kd = kK, vd = kV;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int n = blockIdx.x, unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, h = hv / d.group, t0 = n * c;
    const int64_t cb = chunk_index(d, unit, n);
    float *st = sm + L::t_off, *sa = sm + L::a_off, *sd = sm + L::d_off, *sw = sm + L::w_off, *sv = sm + L::v_off;
    float *sg = sm + L::g_off, *sbeta = sm + L::misc_off, *sdbl = sbeta + kMaxChunk, *sdgl = sdbl + kMaxChunk;
    float* sdbp = sdgl + kK;
    T* sq = reinterpret_cast<T*>(sm + L::h_off);
    T* sk = sq + c * L::ldh;
    T* svv = sk + c * L::ldh;
    float* sx = sv;  // T^T dT once dVn is dead
    pc.mark(0);
    stage_async(st, L::ldt, w.tm + cc_off(d, cb), c, c, c);
    stage_async(sw, L::ldw, dws + ck_off(d, cb), kd, c, kd);
    stage_async(sv, L::ldv, dvns + cv_off(d, cb), vd, c, vd);
    stage_async(sg, L::ldg, w.gam + ck_off(d, cb), kd, c, kd);
    stage_rows(sq, L::ldh, q, d, b, t0, d.h, h, kd);
    stage_rows(sk, L::ldh, k, d, b, t0, d.h, h, kd);
    stage_rows(svv, L::ldh, v, d, b, t0, d.hv, hv, vd);
    cp_async_commit();
    auto valid = [&](int r) { return t0 + r < d.t; };
    for (int r = tid; r < c; r += kBlock) sbeta[r] = valid(r) ? to_f32(beta[beta_at(d, b, t0 + r, hv)]) : 0.0f;
    for (int x = tid; x < kd; x += kBlock) sdgl[x] = dgls[cb * kd + x];
    cp_async_wait<0>();
    __syncthreads();
    // Gamma in base 2 from here on: every factor e^(Gamma_a - Gamma_b) below is one exp2 of a difference.
    for (int e = tid; e < c * kd; e += kBlock) sg[(e / kd) * L::ldg + e % kd] *= kLog2e;
    __syncthreads();
    // The anchored products need every 16-row tile within anchor_ok (kda_mma.cuh).
    bool ok = true;
    for (int e = tid; e < nsub * kd; e += kBlock) {
        const int s = e / kd, x = e % kd;
        float mx = 0.0f;
        for (int r = s * 16; r < s * 16 + 16; ++r)
            mx = fmaxf(mx, fmaxf(fabsf(to_f32(sq[r * L::ldh + x])), fabsf(to_f32(sk[r * L::ldh + x]))));
        ok = ok && anchor_ok((sg[(s * 16) * L::ldg + x] - sg[(s * 16 + 15) * L::ldg + x]) / kLog2e, mx);
    }
    ok = __syncthreads_and(ok) != 0;
    if (tid == 0) fallback[cb] = ok ? 0 : 1;
    if (!ok) return;
    pc.mark(1);
    // dbeta partial sums of this lane's rows (tile i, row g or g + 8), over its columns of dXu v (phase 1) and of
    // dXw k e^Gamma (phase 3); each phase leaves its warp's row sums in sdbp (lanes t summed by shuffles).
    auto flush_dbeta = [&](float(&p)[nsub][2], float* dst) {
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const float s = quad_sum(p[mt][hf]);
                if (t == 0) dst[warp * kMaxChunk + mt * 16 + 8 * hf + g] = s;
            }
    };
    // Row tile m0 and first column n0 of the dT tile in use j (row tile m0 / 16 holds m0 / 8 + 2 of them), in the
    // order of decreasing work for T^T dT: row tiles first to last.
    auto dt_tile = [](int j, int& m0, int& n0) {
        m0 = 0;
        while (j >= m0 / 8 + 2) {
            j -= m0 / 8 + 2;
            m0 += 16;
        }
        n0 = j * 8;
    };
    float dbp[nsub][2] = {};
    // Phase 1: the dT tiles (m0, n0) with n0 < m0 + 16 (only dT's strictly lower part reaches dL, and the tiles of
    // T^T dT that dL reads use no others), each as two half jobs, dW Xw^T into sd and dVn Xu^T into sa (dA is loaded
    // there later), round robin over the warps; then dXu = T^T dVn by groups of 8 value columns (dv = beta dXu,
    // dbeta += dXu . v) on the warps that got one half job fewer: at c = 64, 40 half jobs (16 k-steps of 3xTF32)
    // and 16 groups (20 k-steps of plain TF32) as three half jobs on warps 0-7, two half jobs and two groups on
    // warps 8-15 (with one list, warps 0-7 took three half jobs and a group).
    constexpr int nz = nsub * (nsub + 1);  // dT tiles in use
    const int ngv = vd / 8;
    for (int job = warp; job < 2 * nz; job += kWarps) {
        const int half = job % 2;
        int m0, n0;
        dt_tile(job / 2, m0, n0);
        const int nn = n0 + g;
        const float bn = sbeta[nn];
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (half == 0) {
#pragma unroll 1
            for (int k2 = 0; k2 < kd; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
                for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                    float fa[4], fb[2];
                    frag_a_f(fa, sw, L::ldw, m0, k0, g, t);
                    const int x0 = k0 + t, x1 = x0 + 4;
                    fb[0] = bn * to_f32(sk[nn * L::ldh + x0]) * fast_exp2(sg[nn * L::ldg + x0]);
                    fb[1] = bn * to_f32(sk[nn * L::ldh + x1]) * fast_exp2(sg[nn * L::ldg + x1]);
                    mma_f32<kSplit>(acc, fa, fb);
                }
        } else {
            // dVn V^T, then the columns scaled by beta: v (bf16 or f16) is exact in TF32, so B needs no low part.
#pragma unroll 1
            for (int k2 = 0; k2 < vd; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
                for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                    float fa[4];
                    uint32_t ah[4], al[4], bv[2];
                    frag_a_f(fa, sv, L::ldv, m0, k0, g, t);
#pragma unroll
                    for (int i = 0; i < 4; ++i) split_tf32<kSplit>(fa[i], ah[i], al[i]);
                    bv[0] = tf32_exact(svv[nn * L::ldh + k0 + t]);
                    bv[1] = tf32_exact(svv[nn * L::ldh + k0 + t + 4]);
                    if constexpr (kSplit) mma_tf32(acc, al, bv);
                    mma_tf32(acc, ah, bv);
                }
            const int col = n0 + 2 * t;
            acc[0] *= sbeta[col];
            acc[1] *= sbeta[col + 1];
            acc[2] *= sbeta[col];
            acc[3] *= sbeta[col + 1];
        }
        float* dst = half == 0 ? sd : sa;
        const int r = m0 + g, col = n0 + 2 * t;
        *reinterpret_cast<float2*>(dst + r * L::ldc + col) = make_float2(acc[0], acc[1]);
        *reinterpret_cast<float2*>(dst + (r + 8) * L::ldc + col) = make_float2(acc[2], acc[3]);
    }
    constexpr int rem = (2 * nz) % kWarps;  // warps rem.. have one half job fewer
    for (int q = warp - rem; q >= 0 && q < ngv; q += kWarps - rem) {
        const int y0 = q * 8, ya = y0 + 2 * t;
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt) {
            const int m0 = mt * 16;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
            for (int k2 = m0; k2 < c; k2 += 16)  // (T^T)_ij = T_ji, zero for j < i
#pragma unroll
                for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                    float fa[4], fb[2];
                    frag_at_f(fa, st, L::ldt, m0, k0, g, t);
                    frag_b_f(fb, sv, L::ldv, k0, y0, g, t);
                    // Plain TF32: dXu reaches only dv and dbeta, whose budgets its rounding (~2^-11 relative)
                    // leaves intact; the split matters where the terms cancel in dg's reverse cumsum (dT on).
                    mma_f32<false>(acc, fa, fb);
                }
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = m0 + g + 8 * hf;
                const float x0 = acc[2 * hf], x1 = acc[2 * hf + 1];
                dbp[mt][hf] += x0 * to_f32(svv[r * L::ldh + ya]) + x1 * to_f32(svv[r * L::ldh + ya + 1]);
                if (valid(r)) store_pair(dv + v_row(d, b, t0 + r, hv) + ya, x0 * sbeta[r], x1 * sbeta[r]);
            }
        }
    }
    flush_dbeta(dbp, sdbp);
    __syncthreads();
    pc.mark(2);
    // M's rows for dbeta's L term (below), loaded now so that the global round trip overlaps the T^T dT products:
    // warp w takes rows w + 16 ri, its lanes the columns lane + 32 h.
    float mrow[c / kWarps][c / 32];
    {
        const float* m = w.m + cc_off(d, cb);
#pragma unroll
        for (int ri = 0; ri < c / kWarps; ++ri)
#pragma unroll
            for (int h = 0; h < c / 32; ++h) mrow[ri][h] = m[(warp + ri * kWarps) * c + lane + 32 * h];
    }
    // Phase 2: T^T dT (tiles n0 < m0 + 16 are all the second product reads), then dL = -strict_tril(T^T dT T^T).
    // The tiles in use by decreasing work ((c - m0) / 8 k-steps), the first kWarps one per warp and the rest (the
    // cheapest) to the last warps, which took the cheapest first (at c = 64 the largest load is 8 k-steps, not 12).
    static_assert(nz <= 2 * kWarps, "phase 2 gives a warp at most two tiles");
    for (int pass = 0; pass < 2; ++pass) {
        const int job = pass == 0 ? warp : 2 * kWarps - 1 - warp;
        if (job >= nz) continue;
        int m0, n0;
        dt_tile(job, m0, n0);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
        for (int k2 = m0; k2 < c; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
            for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                float fa[4], fb[2];
                frag_at_f(fa, st, L::ldt, m0, k0, g, t);
                frag_b_f(fb, sd, L::ldc, k0, n0, g, t);
                float fb2[2];
                frag_b_f(fb2, sa, L::ldc, k0, n0, g, t);
                fb[0] += fb2[0];
                fb[1] += fb2[1];
                mma_f32<kSplit>(acc, fa, fb);
            }
        const int r = m0 + g, col = n0 + 2 * t;
        sx[r * L::ldc + col] = acc[0];
        sx[r * L::ldc + col + 1] = acc[1];
        sx[(r + 8) * L::ldc + col] = acc[2];
        sx[(r + 8) * L::ldc + col + 1] = acc[3];
    }
    __syncthreads();
    stage_async(sa, L::ldc, w.a + cc_off(d, cb), c, c, c);  // dA, needed from phase 3 on
    cp_async_commit();
    for (int job = warp; job < nsub * nct; job += kWarps) {
        const int m0 = (job / nct) * 16, n0 = (job % nct) * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (n0 < m0 + 16)
#pragma unroll 1
            for (int k0 = 0; k0 < n0 + 8; k0 += 8) {  // T_jl = 0 for l > j
                float fa[4], fb[2];
                frag_a_f(fa, sx, L::ldc, m0, k0, g, t);
                frag_bt_f(fb, st, L::ldt, k0, n0, g, t);
                mma_f32<kSplit>(acc, fa, fb);
            }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = m0 + g + (e / 2) * 8, j = n0 + 2 * t + (e % 2);
            sd[i * L::ldc + j] = j < i ? -acc[e] : 0.0f;
        }
    }
    __syncthreads();
    // L = Diag(beta) M: dbeta_i = sum_j dL_ij M_ij, dM = Diag(beta) dL (a warp per row).
#pragma unroll
    for (int ri = 0; ri < c / kWarps; ++ri) {
        const int i = warp + ri * kWarps;
        float acc = 0.0f;
#pragma unroll
        for (int h = 0; h < c / 32; ++h) {
            const int j = lane + 32 * h;
            if (j < i) {
                acc += sd[i * L::ldc + j] * mrow[ri][h];
                sd[i * L::ldc + j] *= sbeta[i];
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) sdbl[i] = acc;
    }
    cp_async_wait<0>();
    __syncthreads();
    // dA and dM are the A operands of every warp's intra-chunk products: split them into TF32 parts once.
    uint32_t *ua = reinterpret_cast<uint32_t*>(sa), *ud = reinterpret_cast<uint32_t*>(sd);
    uint32_t *la = reinterpret_cast<uint32_t*>(sv), *ld = la + c * L::ldc;
    split_tile_tf32<kSplit>(sa, la, L::ldc, c, c);
    split_tile_tf32<kSplit>(sd, ld, L::ldc, c, c);
    __syncthreads();
    pc.mark(3);
    // Phase 3: warp (p, r) owns the 16 key channels of groups 2p, 2p + 1 (x0 = 16 p + 8 gi) and the row tiles
    // r and nsub - 1 - r (equal work: a tile's row and column products take 2 (nsub + 1) k-steps together); each
    // A fragment (T^T, dA, dM) it loads serves both groups. This lane holds rows (tile, g / g + 8) and columns
    // x0 + 2t, x0 + 2t + 1 of each group.
    static_assert(kK == 16 * (kWarps / 2) && nsub % 2 == 0, "phase 3 maps 16 warps onto 8 channel pairs x 2 tile sets");
    constexpr int nt = nsub / 2;
    const int pq = warp % (kWarps / 2), rs = warp / (kWarps / 2);
    auto tile_of = [&](int i) { return i == 0 ? rs : nsub - 1 - rs; };
    const float* dqg = dqgs + ck_off(d, cb);
    const float* dkg = dkgs + ck_off(d, cb);
    float ok_[nt][2][4], og[nt][2][4];  // dk, dGamma; dq is stored tile by tile (it has no column term)
    float dbp3[nt][2] = {};             // dbeta partial sums (dXw k e^Gamma) of this lane's rows
    float glp[2][2] = {};               // sum over this lane's rows of dKg kg, per group and column
    // The tile loops stay rolled (the kernel's code has to fit the instruction cache): each pass works on okc, ogc
    // and copies them to or from its tile's registers.
    auto put = [&](int i, const float(&okc)[2][4], const float(&ogc)[2][4]) {
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    ok_[ii][e / 4][e % 4] = okc[e / 4][e % 4];
                    og[ii][e / 4][e % 4] = ogc[e / 4][e % 4];
                }
    };
    auto get = [&](int i, float(&okc)[2][4], float(&ogc)[2][4]) {
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    okc[e / 4][e % 4] = ok_[ii][e / 4][e % 4];
                    ogc[e / 4][e % 4] = og[ii][e / 4][e % 4];
                }
    };
    // dq or dk of this lane's two rows of tile m0 in group gi: the activation dtype, or fp32 per value head (GVA).
    auto store_rows = [&](T* out, float* out_h, int m0, int gi, const float(&o)[4]) {
        const int xa = 16 * pq + 8 * gi + 2 * t;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const int r = m0 + g + 8 * hf;
            if (!valid(r)) continue;
            const int64_t row = g_row(d, b, t0 + r, hv) + xa;
            if (d.group == 1)
                store_pair(out + row, o[2 * hf], o[2 * hf + 1]);
            else
                *reinterpret_cast<float2*>(out_h + row) = make_float2(o[2 * hf], o[2 * hf + 1]);
        }
    };
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int m0 = tile_of(i) * 16;
        float okc[2][4], ogc[2][4], dbc[2] = {0.0f, 0.0f};
        float dx[2][4] = {};  // dXw = T^T dW
#pragma unroll 1
        for (int k2 = m0; k2 < c; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
            for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                float fa[4];
                uint32_t ah[4], al[4];
                frag_at_f(fa, st, L::ldt, m0, k0, g, t);
#pragma unroll
                for (int e = 0; e < 4; ++e) split_tf32<kSplit>(fa[e], ah[e], al[e]);
#pragma unroll
                for (int gi = 0; gi < 2; ++gi) {
                    float fb[2];
                    uint32_t bh[2], bl[2];
                    frag_b_f(fb, sw, L::ldw, k0, 16 * pq + 8 * gi, g, t);
                    split_tf32<kSplit>(fb[0], bh[0], bl[0]);
                    split_tf32<kSplit>(fb[1], bh[1], bl[1]);
                    mma_tf32x3<kSplit>(dx[gi], ah, al, bh, bl);
                }
            }
        // dq = dQg e^G, dk = dKg e^(G_last - G) + beta dXw e^G, dGamma = dQg qg - dKg kg + dXw xw.
        float oq[2][4];
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
            const int xa = 16 * pq + 8 * gi + 2 * t;
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = m0 + g + 8 * hf;
                const float2 a = *reinterpret_cast<const float2*>(dqg + r * kd + xa);
                const float2 bk = *reinterpret_cast<const float2*>(dkg + r * kd + xa);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const int x = xa + s, e = 2 * hf + s;
                    const float gm = sg[r * L::ldg + x], ev = fast_exp2(gm);
                    const float fk = fast_exp2(sg[(c - 1) * L::ldg + x] - gm);
                    const float qv = to_f32(sq[r * L::ldh + x]), kv = to_f32(sk[r * L::ldh + x]);
                    const float av = s == 0 ? a.x : a.y, bv = s == 0 ? bk.x : bk.y, kg = kv * fk;
                    oq[gi][e] = av * ev;
                    okc[gi][e] = bv * fk + sbeta[r] * dx[gi][e] * ev;
                    ogc[gi][e] = av * (qv * ev) - bv * kg + dx[gi][e] * (sbeta[r] * kv * ev);
                    glp[gi][s] += bv * kg;
                    dbc[hf] += dx[gi][e] * kv * ev;
                }
            }
        }
        // Rows: dq_i += sum_j dA_ij f_ij k_j, dk_i += sum_j dM_ij f_ij k_j (anchor: the tile's first row).
        float accq[2][4] = {}, acck[2][4] = {};
#pragma unroll 1
        for (int k2 = 0; k2 < m0 + 16; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
            for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                uint32_t ah[4], al[4], mh[4], ml[4];
                frag_a_f(ah, ua, L::ldc, m0, k0, g, t);
                frag_a_f(al, la, L::ldc, m0, k0, g, t);
                frag_a_f(mh, ud, L::ldc, m0, k0, g, t);
                frag_a_f(ml, ld, L::ldc, m0, k0, g, t);
                const int j0 = k0 + t, j1 = j0 + 4;
#pragma unroll
                for (int gi = 0; gi < 2; ++gi) {
                    const int xb = 16 * pq + 8 * gi + g;
                    const float anb = sg[m0 * L::ldg + xb];
                    uint32_t bh[2], bl[2];
                    split_tf32<kSplit>(
                        to_f32(sk[j0 * L::ldh + xb]) * fast_exp2(anb - sg[j0 * L::ldg + xb]), bh[0], bl[0]);
                    split_tf32<kSplit>(
                        to_f32(sk[j1 * L::ldh + xb]) * fast_exp2(anb - sg[j1 * L::ldg + xb]), bh[1], bl[1]);
                    mma_tf32x3<kSplit>(accq[gi], ah, al, bh, bl);
                    mma_tf32x3<kSplit>(acck[gi], mh, ml, bh, bl);
                }
            }
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
            const int xa = 16 * pq + 8 * gi + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = m0 + g + (e / 2) * 8, x = xa + (e % 2);
                // Rows past T add zeros (selected, not branched around: the products there may hold anything, and
                // q, k are zero-filled).
                const bool ok = valid(r);
                const float f = fast_exp2(sg[r * L::ldg + x] - sg[m0 * L::ldg + x]);
                const float q1 = ok ? accq[gi][e] * f : 0.0f, k1 = ok ? acck[gi][e] * f : 0.0f;
                oq[gi][e] += q1;
                okc[gi][e] += k1;
                ogc[gi][e] += q1 * to_f32(sq[r * L::ldh + x]) + k1 * to_f32(sk[r * L::ldh + x]);
            }
            store_rows(dq, dqh, m0, gi, oq[gi]);
        }
        put(i, okc, ogc);
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i) {
                dbp3[ii][0] = dbc[0];
                dbp3[ii][1] = dbc[1];
            }
    }
    // Columns: dk_j += sum_i (dA_ij q_i + dM_ij k_i) f_ij, dGamma_j -= k_j of that (anchor: the tile's last row).
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int j0 = tile_of(i) * 16, er = j0 + 15;
        float okc[2][4], ogc[2][4];
        get(i, okc, ogc);
        float acc[2][4] = {}, acc2[2][4] = {};
#pragma unroll 1
        for (int k2 = j0; k2 < c; k2 += 16)  // two 8-steps per pass (the count is even)
#pragma unroll
            for (int k0 = k2; k0 < k2 + 16; k0 += 8) {
                uint32_t ah[4], al[4], mh[4], ml[4];
                frag_at_f(ah, ua, L::ldc, j0, k0, g, t);
                frag_at_f(al, la, L::ldc, j0, k0, g, t);
                frag_at_f(mh, ud, L::ldc, j0, k0, g, t);
                frag_at_f(ml, ld, L::ldc, j0, k0, g, t);
                const int r0 = k0 + t, r1 = r0 + 4;
#pragma unroll
                for (int gi = 0; gi < 2; ++gi) {
                    const int xb = 16 * pq + 8 * gi + g;
                    const float anb = sg[er * L::ldg + xb];
                    const float f0 = fast_exp2(sg[r0 * L::ldg + xb] - anb), f1 = fast_exp2(sg[r1 * L::ldg + xb] - anb);
                    uint32_t qh[2], ql[2], kh[2], kl[2];
                    split_tf32<kSplit>(to_f32(sq[r0 * L::ldh + xb]) * f0, qh[0], ql[0]);
                    split_tf32<kSplit>(to_f32(sq[r1 * L::ldh + xb]) * f1, qh[1], ql[1]);
                    split_tf32<kSplit>(to_f32(sk[r0 * L::ldh + xb]) * f0, kh[0], kl[0]);
                    split_tf32<kSplit>(to_f32(sk[r1 * L::ldh + xb]) * f1, kh[1], kl[1]);
                    mma_tf32x3<kSplit>(acc[gi], ah, al, qh, ql);
                    mma_tf32x3<kSplit>(acc2[gi], mh, ml, kh, kl);
                }
            }
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
            const int xa = 16 * pq + 8 * gi + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = j0 + g + (e / 2) * 8, x = xa + (e % 2);
                const float f = fast_exp2(sg[er * L::ldg + x] - sg[j * L::ldg + x]);
                const float s = valid(j) ? (acc[gi][e] + acc2[gi][e]) * f : 0.0f;  // as in the rows' tail
                okc[gi][e] += s;
                ogc[gi][e] -= s * to_f32(sk[j * L::ldh + x]);
            }
            store_rows(dk, dkh, j0, gi, okc[gi]);
        }
        put(i, okc, ogc);
    }
    // dg = reverse cumsum of dGamma over the rows. Inside each tile: a suffix scan over g within each row slot
    // (lanes g + 1, g + 2, g + 4), then slot g gets slot g + 8's total; across tiles through shared memory: the
    // tile totals [nsub, K], and the terms of the last row, which every row's sum includes: gamma (h . dS) (from
    // chunk_mm_tc) plus sum_r dKg_r kg_r ([2, K], one per tile set).
    float* stot = sdbp + 2 * kWarps * kMaxChunk;  // [nsub, K]
    float* sglp = stot + nsub * kK;               // [2, K]
#pragma unroll
    for (int gi = 0; gi < 2; ++gi)
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            float tot = glp[gi][s];
            tot += __shfl_xor_sync(0xffffffffu, tot, 4);
            tot += __shfl_xor_sync(0xffffffffu, tot, 8);
            tot += __shfl_xor_sync(0xffffffffu, tot, 16);
            if (g == 0) sglp[rs * kK + 16 * pq + 8 * gi + 2 * t + s] = tot;
        }
#pragma unroll
    for (int i = 0; i < nt; ++i)
#pragma unroll
        for (int gi = 0; gi < 2; ++gi)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
#pragma unroll
                for (int off = 1; off < 8; off *= 2) {
                    const float o = __shfl_down_sync(0xffffffffu, og[i][gi][e], 4 * off);
                    if (g + off < 8) og[i][gi][e] += o;
                }
            }
#pragma unroll
    for (int i = 0; i < nt; ++i)
#pragma unroll
        for (int gi = 0; gi < 2; ++gi)
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const float low = __shfl_sync(0xffffffffu, og[i][gi][2 + s], t);  // rows 8..15's total
                og[i][gi][s] += low;
                const float tile_total = __shfl_sync(0xffffffffu, og[i][gi][s], t);
                if (g == 0) stot[tile_of(i) * kK + 16 * pq + 8 * gi + 2 * t + s] = tile_total;
            }
    // dbeta partial sums of phase 3, zeros in the rows of the other tile set.
    float dbp_all[nsub][2] = {};
#pragma unroll
    for (int mt = 0; mt < nsub; ++mt)
#pragma unroll
        for (int i = 0; i < nt; ++i)
            if (tile_of(i) == mt) {
                dbp_all[mt][0] = dbp3[i][0];
                dbp_all[mt][1] = dbp3[i][1];
            }
    flush_dbeta(dbp_all, sdbp + kWarps * kMaxChunk);
    __syncthreads();
    pc.mark(4);
#pragma unroll
    for (int i = 0; i < nt; ++i) {
        const int mt = tile_of(i);
#pragma unroll
        for (int gi = 0; gi < 2; ++gi)
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const int x = 16 * pq + 8 * gi + 2 * t + s;
                float carry = sdgl[x] + sglp[x] + sglp[kK + x];
                for (int later = nsub - 1; later > mt; --later) carry += stot[later * kK + x];
                og[i][gi][s] += carry;
                og[i][gi][2 + s] += carry;
            }
#pragma unroll
        for (int gi = 0; gi < 2; ++gi)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = mt * 16 + g + 8 * hf;
                if (valid(r))
                    store_pair(dg + g_row(d, b, t0 + r, hv) + 16 * pq + 8 * gi + 2 * t,
                               og[i][gi][2 * hf],
                               og[i][gi][2 * hf + 1]);
            }
    }
    // dbeta = the L term + the per-warp partial sums of both phases, in warp order.
    for (int r = tid; r < c; r += kBlock) {
        float s = sdbl[r];
        for (int wp = 0; wp < 2 * kWarps; ++wp) s += sdbp[wp * kMaxChunk + r];
        if (valid(r)) dbeta[beta_at(d, b, t0 + r, hv)] = from_f32<T>(s);
    }
    pc.mark(5);
}

}  // namespace

bool use_chunk_smem(const Dims& d, DType dt) {
    static const bool off = env_is("MT_KDA_CHUNK_SMEM", "0");
    return !off && use_chunk_tc(d, dt) && use_intra_tc(d, dt) && use_dt_tc(d, dt) && d.k == kK && d.v == kV;
}

void chunk_smem_launch(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& beta,
                       const Dims& d,
                       const Work& w,
                       const float* dvn,
                       const float* dqg,
                       const float* dkg,
                       const float* dw,
                       const float* dgl,
                       float* dqh,
                       float* dkh,
                       const Tensor& dq,
                       const Tensor& dk,
                       const Tensor& dv,
                       const Tensor& dg,
                       const Tensor& dbeta,
                       int* fallback) {
    const dim3 grid(static_cast<unsigned>(d.nc), static_cast<unsigned>(d.units()));
    const size_t smem = d.c == 64 ? Layout<64>::bytes : Layout<32>::bytes;
    const PhaseLog phases("chunk_smem", static_cast<int64_t>(d.units()) * d.nc);
    auto run = [&](auto kernel, auto tag) {
        using T = decltype(tag);
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kBlock, smem, core::cuda_stream()>>>(static_cast<const T*>(q.raw()),
                                                            static_cast<const T*>(k.raw()),
                                                            static_cast<const T*>(v.raw()),
                                                            static_cast<const T*>(beta.raw()),
                                                            d,
                                                            w,
                                                            dvn,
                                                            dqg,
                                                            dkg,
                                                            dw,
                                                            dgl,
                                                            dqh,
                                                            dkh,
                                                            static_cast<T*>(dq.raw()),
                                                            static_cast<T*>(dk.raw()),
                                                            static_cast<T*>(dv.raw()),
                                                            static_cast<T*>(dg.raw()),
                                                            static_cast<T*>(dbeta.raw()),
                                                            fallback,
                                                            phases.clock());
    };
    auto by_type = [&](auto tag) {
        using T = decltype(tag);
        const bool split = bwd_split_tc();
        if (d.c == 64)
            split ? run(chunk_smem_kernel<T, true, 64>, tag) : run(chunk_smem_kernel<T, false, 64>, tag);
        else
            split ? run(chunk_smem_kernel<T, true, 32>, tag) : run(chunk_smem_kernel<T, false, 32>, tag);
    };
    if (q.dtype() == DType::bf16)
        by_type(bf16{});
    else
        by_type(f16{});
    MT_CUDA_CHECK(cudaGetLastError());
    phases.print(6);
}

}  // namespace mt::ops::cuda::kda
