// The backward chunk step's intra-chunk terms (kda.md §4.6 step 5) on tensor cores, for the inputs kda::use_tc
// accepts: with f_ij = e^(G_i - G_j) per key channel (i >= j),
//   rows:    dq_i += sum_j dA_ij f_ij k_j,  dk_i += sum_j dM_ij f_ij k_j,  dG_i += q_i dq_intra + k_i dk_row
//   columns: dk_j += sum_i (dA_ij q_i + dM_ij k_i) f_ij,                  dG_j -= k_j dk_col
// as 16-row tile products over tokens with one anchor per tile (spec §4.2), instead of one exponential per term:
//   rows of tile a, anchor n = its first row: f_ij = e^(G_i - G_n) e^(G_n - G_j); the product runs over j with
//     operand k_j e^(G_n - G_j), the result is scaled by e^(G_i - G_n) <= 1;
//   columns of tile b, anchor e = its last row: f_ij = e^(G_i - G_e) e^(G_e - G_j); the product runs over i >= j with
//     operand q_i (k_i) e^(G_i - G_e), the result is scaled by e^(G_e - G_j) <= 1.
// Inside the diagonal tile one operand factor is >= 1, at most e^(G_first - G_last) of the sub-chunk: the chunk takes
// this path only when that is <= kAnchorMaxNats (76) nats for every channel and sub-chunk (always for the lower-bounded
// gate, 15 * 5 = 75), else the caller's pairwise loops run. TF32 operands split in two (3xTF32, about fp32 precision:
// the dGamma terms cancel, and plain TF32 measured dg 1.8e-2 at g = -5; the one-TF32 variant was deleted), fp32
// accumulation; each output element has one owner lane and a fixed k order: deterministic. dA, dM (= Diag(beta) dL)
// are [c, c] in shared memory; q, k and Gamma are read from global memory (the L1 keeps the chunk's rows), so the
// kernel keeps its small shared-memory footprint.
#pragma once

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"

namespace mt::ops::cuda::kda {

// e^x: the accurate expf when the products are split (3xTF32), the fast one with plain TF32 operands.
template <bool kSplit>
__device__ __forceinline__ float ex(float x) {
    return kSplit ? expf(x) : __expf(x);
}

template <typename T, bool kSplit>
__device__ bool intra_tc(const T* __restrict__ q,
                         const T* __restrict__ k,
                         const Dims& d,
                         int b,
                         int h,
                         int t0,
                         const float* __restrict__ gam,
                         const float* sda,
                         const float* sdm,
                         float* dqg,
                         float* dkg,
                         float* dxw) {
    const int c = d.c, kd = d.k, nsub = c / 16, ngrp = kd / 8;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, warps = blockDim.x / 32, g = lane / 4, t = lane % 4;
    auto valid = [&](int r) { return t0 + r < d.t; };
    auto qat = [&](int r, int x) { return valid(r) ? to_f32(q[qk_row(d, b, t0 + r, h) + x]) : 0.0f; };
    auto kat = [&](int r, int x) { return valid(r) ? to_f32(k[qk_row(d, b, t0 + r, h) + x]) : 0.0f; };
    bool ok = true;
    for (int e = tid; e < nsub * kd; e += blockDim.x) {
        const int s = e / kd, x = e % kd;
        float mx = 0.0f;
        for (int r = s * 16; r < s * 16 + 16; ++r) mx = fmaxf(mx, fmaxf(fabsf(qat(r, x)), fabsf(kat(r, x))));
        ok = ok && anchor_ok(gam[(s * 16) * kd + x] - gam[(s * 16 + 15) * kd + x], mx);
    }
    if (__syncthreads_and(ok) == 0) return false;
    // Rows: a job is (row tile a, 8 channels).
    for (int job = warp; job < nsub * ngrp; job += warps) {
        const int i0 = (job / ngrp) * 16, x0 = (job % ngrp) * 8, xb = x0 + g;
        const float anb = gam[i0 * kd + xb];
        float accq[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acck[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < i0 + 16; k0 += 8) {
            float fa[4], fm[4], fb[2];
            frag_a_f(fa, sda, c, i0, k0, g, t);
            frag_a_f(fm, sdm, c, i0, k0, g, t);
            const int j0 = k0 + t, j1 = j0 + 4;
            fb[0] = kat(j0, xb) * ex<kSplit>(anb - gam[j0 * kd + xb]);
            fb[1] = kat(j1, xb) * ex<kSplit>(anb - gam[j1 * kd + xb]);
            mma_f32<kSplit>(accq, fa, fb);
            mma_f32<kSplit>(acck, fm, fb);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + g + (e / 2) * 8, x = x0 + 2 * t + (e % 2);
            if (!valid(i)) continue;
            const float f = ex<kSplit>(gam[i * kd + x] - gam[i0 * kd + x]), oq = accq[e] * f, okk = acck[e] * f;
            dqg[i * kd + x] += oq;
            dkg[i * kd + x] += okk;
            dxw[i * kd + x] += oq * qat(i, x) + okk * kat(i, x);
        }
    }
    __syncthreads();
    // Columns: a job is (column tile, 8 channels); the product runs over rows i from the tile's first row.
    for (int job = warp; job < nsub * ngrp; job += warps) {
        const int j0 = (job / ngrp) * 16, er = j0 + 15, x0 = (job % ngrp) * 8, xb = x0 + g;
        const float anb = gam[er * kd + xb];
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = j0; k0 < c; k0 += 8) {
            float fa[4], fm[4], fq[2], fk[2];
            frag_at_f(fa, sda, c, j0, k0, g, t);
            frag_at_f(fm, sdm, c, j0, k0, g, t);
            const int r0 = k0 + t, r1 = r0 + 4;
            const float f0 = ex<kSplit>(gam[r0 * kd + xb] - anb), f1 = ex<kSplit>(gam[r1 * kd + xb] - anb);
            fq[0] = qat(r0, xb) * f0;
            fq[1] = qat(r1, xb) * f1;
            fk[0] = kat(r0, xb) * f0;
            fk[1] = kat(r1, xb) * f1;
            mma_f32<kSplit>(acc, fa, fq);
            mma_f32<kSplit>(acc, fm, fk);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = j0 + g + (e / 2) * 8, x = x0 + 2 * t + (e % 2);
            if (!valid(j)) continue;
            const float s = acc[e] * ex<kSplit>(gam[er * kd + x] - gam[j * kd + x]);
            dkg[j * kd + x] += s;
            dxw[j * kd + x] -= s * kat(j, x);
        }
    }
    return true;
}

// The chunk step's products over T (kda.md §4.6 step 4) on tensor cores, for the same inputs: dXw = T^T dW,
// dXu = T^T dVn (global scratch), dT = dW Xw^T + dVn Xu^T with Xu = Diag(beta) V (into sdt). Warps own 16x8 output
// tiles, T's zero tiles skipped; operands from global memory (fp32 workspace and scratch, v), TF32, fp32 sums.
template <typename T, bool kSplit>
__device__ void dt_tc(const T* __restrict__ v,
                      const Dims& d,
                      int b,
                      int hv,
                      int t0,
                      const float* __restrict__ tm,
                      const float* dw,
                      const float* __restrict__ dvn,
                      const float* xw,  // not __restrict__: the chunk kernel may have written it (kda_bwd.cu, fill_xw)
                      const float* sbeta,
                      float* dxw,
                      float* dxu,
                      float* sdt) {
    const int c = d.c, kd = d.k, vd = d.v, nsub = c / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, g = lane / 4, t = lane % 4;
    const int gk = kd / 8, gv = vd / 8, n1 = nsub * gk, n2 = nsub * gv;
    for (int job = warp; job < n1 + n2; job += warps) {
        const bool isw = job < n1;
        const int jj = isw ? job : job - n1, ng = isw ? gk : gv, ld = isw ? kd : vd;
        const int m0 = (jj / ng) * 16, n0 = (jj % ng) * 8;
        const float* src = isw ? dw : dvn;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = m0; k0 < c; k0 += 8) {  // (T^T)_ij = T_ji, zero for j < i
            float fa[4], fb[2];
            frag_at_f(fa, tm, c, m0, k0, g, t);
            frag_b_f(fb, src, ld, k0, n0, g, t);
            mma_f32<kSplit>(acc, fa, fb);
        }
        float* dst = isw ? dxw : dxu;
        const int r = m0 + g, col = n0 + 2 * t;
        *reinterpret_cast<float2*>(dst + r * ld + col) = make_float2(acc[0], acc[1]);
        *reinterpret_cast<float2*>(dst + (r + 8) * ld + col) = make_float2(acc[2], acc[3]);
    }
    for (int job = warp; job < nsub * (c / 8); job += warps) {
        const int m0 = (job / (c / 8)) * 16, n0 = (job % (c / 8)) * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < kd; k0 += 8) {
            float fa[4], fb[2];
            frag_a_f(fa, dw, kd, m0, k0, g, t);
            frag_bt_f(fb, xw, kd, k0, n0, g, t);
            mma_f32<kSplit>(acc, fa, fb);
        }
        const int j = n0 + g;
        const bool ok = t0 + j < d.t;
        const float bj = sbeta[j];
        const T* vr = v + v_row(d, b, ok ? t0 + j : t0, hv);
        for (int k0 = 0; k0 < vd; k0 += 8) {
            float fa[4], fb[2];
            frag_a_f(fa, dvn, vd, m0, k0, g, t);
            fb[0] = ok ? bj * to_f32(vr[k0 + t]) : 0.0f;
            fb[1] = ok ? bj * to_f32(vr[k0 + t + 4]) : 0.0f;
            mma_f32<kSplit>(acc, fa, fb);
        }
        const int r = m0 + g, col = n0 + 2 * t;
        sdt[r * c + col] = acc[0];
        sdt[r * c + col + 1] = acc[1];
        sdt[(r + 8) * c + col] = acc[2];
        sdt[(r + 8) * c + col + 1] = acc[3];
    }
}

// dL = -strict_tril(T^T dT T^T) on tensor cores: stmp = T^T dT (rows i read T_li for l >= i), then
// dL_ij = -sum_{l <= j} stmp_il T_jl for j < i, into sdt. The caller synchronises before; this synchronises between
// the two products and leaves the caller to synchronise after.
template <bool kSplit>
__device__ void tdt_tc(const Dims& d, const float* __restrict__ tm, float* sdt, float* stmp) {
    const int c = d.c, nsub = c / 16;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, g = lane / 4, t = lane % 4;
    for (int job = warp; job < nsub * (c / 8); job += warps) {
        const int m0 = (job / (c / 8)) * 16, n0 = (job % (c / 8)) * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = m0; k0 < c; k0 += 8) {
            float fa[4], fb[2];
            frag_at_f(fa, tm, c, m0, k0, g, t);
            frag_b_f(fb, sdt, c, k0, n0, g, t);
            mma_f32<kSplit>(acc, fa, fb);
        }
        const int r = m0 + g, col = n0 + 2 * t;
        stmp[r * c + col] = acc[0];
        stmp[r * c + col + 1] = acc[1];
        stmp[(r + 8) * c + col] = acc[2];
        stmp[(r + 8) * c + col + 1] = acc[3];
    }
    __syncthreads();
    for (int job = warp; job < nsub * (c / 8); job += warps) {
        const int m0 = (job / (c / 8)) * 16, n0 = (job % (c / 8)) * 8;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 < n0 + 8; k0 += 8) {  // T_jl = 0 for l > j
            float fa[4], fb[2];
            frag_a_f(fa, stmp, c, m0, k0, g, t);
            frag_bt_f(fb, tm, c, k0, n0, g, t);
            mma_f32<kSplit>(acc, fa, fb);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = m0 + g + (e / 2) * 8, j = n0 + 2 * t + (e % 2);
            sdt[i * c + j] = j < i ? -acc[e] : 0.0f;
        }
    }
}

}  // namespace mt::ops::cuda::kda
