// The KDA backward chunk step (kda.md §4.6 steps 4-6) as one block per (chunk, unit) whose operands all sit in
// shared memory, for the inputs of the tensor-core path (kda::use_chunk_tc) at K = V = 128. It replaces, for those
// chunks, chunk_kernel's dt_tc / tdt_tc / elementwise / intra_tc / cumsum phases, which read every MMA fragment
// from the fp32 workspace in global memory and kept dq, dk, dGamma there between phases (9.6 ms at 8 x 4096).
//
// Inputs: T, dA (from chunk_mm_tc), dW and dVn (the chunk scratch), Gamma, q, k, v, beta, staged once by cp.async;
// dQg, dKg (chunk scratch) and M are read where they are used, once each. Phases (16 warps):
//   1. dT = dW Xw^T + dVn Xu^T, only its tiles that reach dL (the strictly lower part: dL = -strict_tril(T^T dT T^T)
//      involves dT_lm for l > m only), Xw = Diag(beta) k e^Gamma rebuilt from q, k, Gamma; dXu = T^T dVn by value
//      column group, dv = beta dXu straight to global memory.
//   2. T^T dT, then dL, then dbeta's L term and dM = Diag(beta) dL::
//   3. A warp per 8 key channels, over all c rows: dXw = T^T dW, the elementwise factors, the intra-chunk terms
//      (kda_intra_tc.cuh's anchored tile products, operands from shared memory), the last row's dGamma, the reverse
//      cumsum of dGamma over the rows by shuffles, and dq, dk, dg stored. Every per-channel quantity stays in the
//      owning warp's registers, so the phase needs no block barrier.
// Products are 3xTF32 (kda::bwd_split_tc) like the kernels they replace; each output element has one owner lane and
// a fixed summation order: deterministic. A chunk whose Gamma spread inside a 16-row tile exceeds the anchors'
// bound (only possible with the unbounded gate) is left to chunk_kernel: this kernel marks it in `fallback` and
// writes nothing else for it.
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/kda_intra_tc.cuh"
#include "ops/cuda/kda_mma.cuh"

namespace mt::ops::cuda::kda {

namespace {

constexpr int kWarps = 16;
constexpr int kBlock = kWarps * 32;

// The head sizes of the kernel: the model's K = V = 128, compile-time so that every stride and offset below is an
// immediate (with runtime K and V the kernel needed ~40 more registers and spilled at 512 threads).
constexpr int kK = 128, kV = 128;
constexpr float kLog2e = 1.4426950408889634f;

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
    static constexpr int h_off = misc_off + 2 * kMaxChunk + kK + 2 * kWarps * kMaxChunk;  // q, k, v (2-byte)
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
    // Gamma in base 2 from here on: every factor e^(Gamma_a - Gamma_b) below is one exp2f of a difference.
    for (int e = tid; e < c * kd; e += kBlock) sg[(e / kd) * L::ldg + e % kd] *= kLog2e;
    __syncthreads();
    // The anchored products need e^(Gamma_first - Gamma_last) <= e^80 inside every 16-row tile (kda_intra_tc.cuh).
    bool ok = true;
    for (int e = tid; e < nsub * kd; e += kBlock) {
        const int s = e / kd, x = e % kd;
        ok = ok && sg[(s * 16) * L::ldg + x] - sg[(s * 16 + 15) * L::ldg + x] <= 80.0f * kLog2e;
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
                float s = p[mt][hf];
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                if (t == 0) dst[warp * kMaxChunk + mt * 16 + 8 * hf + g] = s;
            }
    };
    float dbp[nsub][2] = {};
    // Phase 1, one job list over the warps (the larger jobs first): dXu = T^T dVn by groups of 8 value columns
    // (dv = beta dXu, dbeta += dXu . v), then the dT tiles (m0, n0) with n0 < m0 + 16 (only dT's strictly lower part
    // reaches dL, and the tiles of T^T dT that dL reads use no others), each as two half jobs: dW Xw^T into sd and
    // dVn Xu^T into sa (dA is loaded there later).
    constexpr int nz = nsub * (nsub + 1);  // dT tiles in use
    const int ngv = vd / 8;
    for (int job = warp; job < ngv + 2 * nz; job += kWarps) {
        if (job < ngv) {
            const int y0 = job * 8, ya = y0 + 2 * t;
#pragma unroll
            for (int mt = 0; mt < nsub; ++mt) {
                const int m0 = mt * 16;
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int k0 = m0; k0 < c; k0 += 8) {  // (T^T)_ij = T_ji, zero for j < i
                    float fa[4], fb[2];
                    frag_at_f(fa, st, L::ldt, m0, k0, g, t);
                    frag_b_f(fb, sv, L::ldv, k0, y0, g, t);
                    mma_f32<kSplit>(acc, fa, fb);
                }
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int r = m0 + g + 8 * hf;
                    const float x0 = acc[2 * hf], x1 = acc[2 * hf + 1];
                    dbp[mt][hf] += x0 * to_f32(svv[r * L::ldh + ya]) + x1 * to_f32(svv[r * L::ldh + ya + 1]);
                    if (valid(r)) store_pair(dv + v_row(d, b, t0 + r, hv) + ya, x0 * sbeta[r], x1 * sbeta[r]);
                }
            }
            continue;
        }
        const int half = (job - ngv) % 2;
        int tile = (job - ngv) / 2, m0 = 0;
        while (tile >= m0 / 8 + 2) {  // row tile m0 / 16 holds m0 / 8 + 2 tiles in use
            tile -= m0 / 8 + 2;
            m0 += 16;
        }
        const int n0 = tile * 8, nn = n0 + g;
        const float bn = sbeta[nn];
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (half == 0) {
            for (int k0 = 0; k0 < kd; k0 += 8) {
                float fa[4], fb[2];
                frag_a_f(fa, sw, L::ldw, m0, k0, g, t);
                const int x0 = k0 + t, x1 = x0 + 4;
                fb[0] = bn * to_f32(sk[nn * L::ldh + x0]) * exp2f(sg[nn * L::ldg + x0]);
                fb[1] = bn * to_f32(sk[nn * L::ldh + x1]) * exp2f(sg[nn * L::ldg + x1]);
                mma_f32<kSplit>(acc, fa, fb);
            }
        } else {
            // dVn V^T, then the columns scaled by beta: v (bf16 or f16) is exact in TF32, so B needs no low part.
            for (int k0 = 0; k0 < vd; k0 += 8) {
                float fa[4];
                uint32_t ah[4], al[4], bv[2];
                frag_a_f(fa, sv, L::ldv, m0, k0, g, t);
#pragma unroll
                for (int i = 0; i < 4; ++i) split_tf32<kSplit>(fa[i], ah[i], al[i]);
                bv[0] = __float_as_uint(to_f32(svv[nn * L::ldh + k0 + t]));
                bv[1] = __float_as_uint(to_f32(svv[nn * L::ldh + k0 + t + 4]));
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
    flush_dbeta(dbp, sdbp);
    __syncthreads();
    pc.mark(2);
    // Phase 2: T^T dT (tiles n0 < m0 + 16 are all the second product reads), then dL = -strict_tril(T^T dT T^T).
    for (int job = warp; job < nsub * nct; job += kWarps) {
        const int m0 = (job / nct) * 16, n0 = (job % nct) * 8;
        if (n0 >= m0 + 16) continue;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = m0; k0 < c; k0 += 8) {
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
    const float* m = w.m + cc_off(d, cb);
    for (int i = warp; i < c; i += kWarps) {
        float acc = 0.0f;
        for (int j = lane; j < i; j += 32) {
            acc += sd[i * L::ldc + j] * m[i * c + j];
            sd[i * L::ldc + j] *= sbeta[i];
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
    float dbp3[nsub][2] = {};
    // Phase 3: a warp per 8 key channels x0..x0+7; this lane holds rows (tile i, g / g + 8), columns xa, xa + 1.
    const float* dqg = dqgs + ck_off(d, cb);
    const float* dkg = dkgs + ck_off(d, cb);
    for (int grp = warp; grp < kd / 8; grp += kWarps) {
        const int x0 = grp * 8, xa = x0 + 2 * t, xb = x0 + g;
        float ok_[nsub][4], og[nsub][4];  // dk, dGamma; dq is stored tile by tile (it has no column term)
        float glp[2] = {0.0f, 0.0f};      // sum over this lane's rows of dKg kg, per column
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt) {
            const int m0 = mt * 16;
            float dx[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // dXw = T^T dW
#pragma unroll 1
            for (int k0 = m0; k0 < c; k0 += 8) {
                float fa[4], fb[2];
                frag_at_f(fa, st, L::ldt, m0, k0, g, t);
                frag_b_f(fb, sw, L::ldw, k0, x0, g, t);
                mma_f32<kSplit>(dx, fa, fb);
            }
            // dq = dQg e^G, dk = dKg e^(G_last - G) + beta dXw e^G, dGamma = dQg qg - dKg kg + dXw xw.
            float oq[4];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = m0 + g + 8 * hf;
                const float2 a = *reinterpret_cast<const float2*>(dqg + r * kd + xa);
                const float2 bk = *reinterpret_cast<const float2*>(dkg + r * kd + xa);
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const int x = xa + s, e = 2 * hf + s;
                    const float gm = sg[r * L::ldg + x], ev = exp2f(gm);
                    const float fk = exp2f(sg[(c - 1) * L::ldg + x] - gm);
                    const float qv = to_f32(sq[r * L::ldh + x]), kv = to_f32(sk[r * L::ldh + x]);
                    const float av = s == 0 ? a.x : a.y, bv = s == 0 ? bk.x : bk.y, kg = kv * fk;
                    oq[e] = av * ev;
                    ok_[mt][e] = bv * fk + sbeta[r] * dx[e] * ev;
                    og[mt][e] = av * (qv * ev) - bv * kg + dx[e] * (sbeta[r] * kv * ev);
                    glp[s] += bv * kg;
                    dbp3[mt][hf] += dx[e] * kv * ev;
                }
            }
            // Rows: dq_i += sum_j dA_ij f_ij k_j, dk_i += sum_j dM_ij f_ij k_j (anchor: the tile's first row).
            const float anb = sg[m0 * L::ldg + xb];
            float accq[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acck[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
            for (int k0 = 0; k0 < m0 + 16; k0 += 8) {
                uint32_t ah[4], al[4], mh[4], ml[4], bh[2], bl[2];
                frag_a_u(ah, ua, L::ldc, m0, k0, g, t);
                frag_a_u(al, la, L::ldc, m0, k0, g, t);
                frag_a_u(mh, ud, L::ldc, m0, k0, g, t);
                frag_a_u(ml, ld, L::ldc, m0, k0, g, t);
                const int j0 = k0 + t, j1 = j0 + 4;
                split_tf32<kSplit>(to_f32(sk[j0 * L::ldh + xb]) * exp2f(anb - sg[j0 * L::ldg + xb]), bh[0], bl[0]);
                split_tf32<kSplit>(to_f32(sk[j1 * L::ldh + xb]) * exp2f(anb - sg[j1 * L::ldg + xb]), bh[1], bl[1]);
                mma_tf32x3<kSplit>(accq, ah, al, bh, bl);
                mma_tf32x3<kSplit>(acck, mh, ml, bh, bl);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + g + (e / 2) * 8, x = xa + (e % 2);
                if (!valid(i)) continue;
                const float f = exp2f(sg[i * L::ldg + x] - sg[m0 * L::ldg + x]);
                const float q1 = accq[e] * f, k1 = acck[e] * f;
                oq[e] += q1;
                ok_[mt][e] += k1;
                og[mt][e] += q1 * to_f32(sq[i * L::ldh + x]) + k1 * to_f32(sk[i * L::ldh + x]);
            }
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = m0 + g + 8 * hf;
                if (!valid(r)) continue;
                const int64_t row = g_row(d, b, t0 + r, hv) + xa;
                if (d.group == 1)
                    store_pair(dq + row, oq[2 * hf], oq[2 * hf + 1]);
                else
                    *reinterpret_cast<float2*>(dqh + row) = make_float2(oq[2 * hf], oq[2 * hf + 1]);
            }
        }
        // Columns: dk_j += sum_i (dA_ij q_i + dM_ij k_i) f_ij, dGamma_j -= k_j of that (anchor: the tile's last row).
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt) {
            const int j0 = mt * 16, er = j0 + 15;
            const float anb = sg[er * L::ldg + xb];
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
            for (int k0 = j0; k0 < c; k0 += 8) {
                uint32_t ah[4], al[4], mh[4], ml[4], qh[2], ql[2], kh[2], kl[2];
                frag_at_u(ah, ua, L::ldc, j0, k0, g, t);
                frag_at_u(al, la, L::ldc, j0, k0, g, t);
                frag_at_u(mh, ud, L::ldc, j0, k0, g, t);
                frag_at_u(ml, ld, L::ldc, j0, k0, g, t);
                const int r0 = k0 + t, r1 = r0 + 4;
                const float f0 = exp2f(sg[r0 * L::ldg + xb] - anb), f1 = exp2f(sg[r1 * L::ldg + xb] - anb);
                split_tf32<kSplit>(to_f32(sq[r0 * L::ldh + xb]) * f0, qh[0], ql[0]);
                split_tf32<kSplit>(to_f32(sq[r1 * L::ldh + xb]) * f1, qh[1], ql[1]);
                split_tf32<kSplit>(to_f32(sk[r0 * L::ldh + xb]) * f0, kh[0], kl[0]);
                split_tf32<kSplit>(to_f32(sk[r1 * L::ldh + xb]) * f1, kh[1], kl[1]);
                mma_tf32x3<kSplit>(acc, ah, al, qh, ql);
                mma_tf32x3<kSplit>(acc2, mh, ml, kh, kl);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] += acc2[e];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = j0 + g + (e / 2) * 8, x = xa + (e % 2);
                if (!valid(j)) continue;
                const float s = acc[e] * exp2f(sg[er * L::ldg + x] - sg[j * L::ldg + x]);
                ok_[mt][e] += s;
                og[mt][e] -= s * to_f32(sk[j * L::ldh + x]);
            }
        }
        // The last row's dGamma gets gamma (h . dS) (from chunk_mm_tc) plus sum_r dKg_r kg_r.
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            float tot = glp[s];
            tot += __shfl_xor_sync(0xffffffffu, tot, 4);
            tot += __shfl_xor_sync(0xffffffffu, tot, 8);
            tot += __shfl_xor_sync(0xffffffffu, tot, 16);
            if (g == 7) og[nsub - 1][2 + s] += sdgl[xa + s] + tot;
        }
        // dg = reverse cumsum of dGamma over the rows. Row r = 16 mt + 8 hf + g lives in lane (g, t), slot
        // (mt, hf): a suffix scan over g within each slot (lanes g + 1, g + 2, g + 4), then each slot adds the totals
        // of the slots below it (held by lane g = 0 after the scan).
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
#pragma unroll
                for (int off = 1; off < 8; off *= 2) {
                    const float o = __shfl_down_sync(0xffffffffu, og[mt][e], 4 * off);
                    if (g + off < 8) og[mt][e] += o;
                }
            }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            float carry = 0.0f;
#pragma unroll
            for (int mt = nsub - 1; mt >= 0; --mt)
#pragma unroll
                for (int hf = 1; hf >= 0; --hf) {
                    const int e = 2 * hf + s;
                    const float slot_total = __shfl_sync(0xffffffffu, og[mt][e], t);
                    og[mt][e] += carry;
                    carry += slot_total;
                }
        }
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int r = mt * 16 + g + 8 * hf;
                if (!valid(r)) continue;
                const int64_t row = g_row(d, b, t0 + r, hv) + xa;
                const int e = 2 * hf;
                store_pair(dg + row, og[mt][e], og[mt][e + 1]);
                if (d.group == 1)
                    store_pair(dk + row, ok_[mt][e], ok_[mt][e + 1]);
                else
                    *reinterpret_cast<float2*>(dkh + row) = make_float2(ok_[mt][e], ok_[mt][e + 1]);
            }
    }
    pc.mark(4);
    // dbeta = the L term + the per-warp partial sums of both phases, in warp order.
    flush_dbeta(dbp3, sdbp + kWarps * kMaxChunk);
    __syncthreads();
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
