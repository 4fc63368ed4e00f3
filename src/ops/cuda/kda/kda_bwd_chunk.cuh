// The phases of chunk_kernel (kda_bwd.cu), the KDA backward chunk step (kda.md §4.6 steps 2 and 4-7) of one
// (chunk, unit) with fp32 math: ChunkBwd holds the block's indices, its shared-memory tiles and the chunk's views of
// the workspace and scratch, and each member function is one phase; the kernel calls them in order, with the barriers
// between them. Every member is inlined into the kernel, so the split costs nothing at run time.
#pragma once

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_intra_tc.cuh"
#include "ops/cuda/kda/kda_mma.cuh"

namespace mt::ops::cuda::kda {

template <typename T>
struct ChunkBwd {
    const Dims& d;
    const T *const q, *const k, *const v, *const dout;
    const int c, kd, vd, tid, nt;
    float *const sda, *const sdt, *const stmp, *const sbeta, *const sdb, *const sdgl;
    const int n, unit, b, hv, h, t0;
    const int64_t cb, kv;
    const float* const gam;
    float* const xw;
    const float *const m, *const tm;
    const float* const hh;  // state entering the chunk [kd, vd]
    const float* const ds;  // gradient of the state leaving it
    const float *const vn, *const dvn;
    float *const dqg, *const dkg, *const dw, *const dxw, *const dxu;
    const int warp, lane, warps;

    // smem: dA [c, c], dT then dM [c, c], T^T dT [c, c], beta, dbeta [kMaxChunk] each, the last row's dGamma [kd].
    // The scratch (dqg, dkg, dw, dxw [units, nc, C, K], dxu [units, nc, C, V]) becomes dq, dk, -, dGamma, -.
    __device__ __forceinline__ ChunkBwd(float* smem,
                                        const Dims& dims,
                                        const Work& w,
                                        const T* q_,
                                        const T* k_,
                                        const T* v_,
                                        const T* dout_,
                                        const float* hs,
                                        const float* vns,
                                        const float* dvns,
                                        const float* dhs,
                                        float* sdqg,
                                        float* sdkg,
                                        float* sdw,
                                        float* sdxw,
                                        float* sdxu)
        : d(dims),
          q(q_),
          k(k_),
          v(v_),
          dout(dout_),
          c(d.c),
          kd(d.k),
          vd(d.v),
          tid(threadIdx.x),
          nt(blockDim.x),
          sda(smem),
          sdt(sda + c * c),
          stmp(sdt + c * c),
          sbeta(stmp + c * c),
          sdb(sbeta + kMaxChunk),
          sdgl(sdb + kMaxChunk),
          n(blockIdx.x),
          unit(blockIdx.y),
          b(unit / d.hv),
          hv(unit % d.hv),
          h(hv / d.group),
          t0(n * c),
          cb(chunk_index(d, unit, n)),
          kv(static_cast<int64_t>(kd) * vd),
          gam(w.gam + ck_off(d, cb)),
          xw(w.xw + ck_off(d, cb)),
          m(w.m + cc_off(d, cb)),
          tm(w.tm + cc_off(d, cb)),
          hh(hs != nullptr ? hs + cb * kv : nullptr),  // null: chunk_mm_tc did the products that read h
          ds(dhs + cb * kv),
          vn(vns != nullptr ? vns + cv_off(d, cb) : nullptr),
          dvn(dvns + cv_off(d, cb)),
          dqg(sdqg + ck_off(d, cb)),
          dkg(sdkg + ck_off(d, cb)),
          dw(sdw + ck_off(d, cb)),
          dxw(sdxw + ck_off(d, cb)),
          dxu(sdxu + cv_off(d, cb)),
          warp(tid / 32),
          lane(tid % 32),
          warps(nt / 32) {}

    __device__ __forceinline__ bool valid(int r) const {
        return t0 + r < d.t;
    }
    __device__ __forceinline__ int row(int r) const {
        return valid(r) ? t0 + r : 0;
    }
    __device__ __forceinline__ float qat(int r, int x) const {
        return ld(q, qk_row(d, b, row(r), h) + x, valid(r));
    }
    __device__ __forceinline__ float kat(int r, int x) const {
        return ld(k, qk_row(d, b, row(r), h) + x, valid(r));
    }
    __device__ __forceinline__ float vat(int r, int y) const {
        return ld(v, v_row(d, b, row(r), hv) + y, valid(r));
    }
    __device__ __forceinline__ float doat(int r, int y) const {
        return ld(dout, v_row(d, b, row(r), hv) + y, valid(r));
    }

    // beta into shared memory; with fill_xw, Xw = Diag(beta) k e^Gamma into the workspace (the forward kept Gamma, Qg,
    // Kg and W but not Xw, which only this kernel reads: formed here, as prep_tc forms it, the same product bit for
    // bit, and read back by this block after the barrier).
    __device__ __forceinline__ void stage_beta(const T* __restrict__ beta, bool fill_xw) const {
        for (int r = tid; r < c; r += nt) sbeta[r] = ld(beta, beta_at(d, b, row(r), hv), valid(r));
        if (fill_xw) {
            __syncthreads();
            for (int e = tid; e < c * kd; e += nt) xw[e] = sbeta[e / kd] * kat(e / kd, e % kd) * expf(gam[e]);
            __syncthreads();
        }
    }

    // kda.md §4.6 steps 2 and 4, the products over V: dA = tril(dO Vn^T), dQg = dO h^T, dKg = Vn dS^T, dW = -dVn h^T
    // and the last row's state term of dGamma, one warp per output, the lanes over the value columns (coalesced
    // rows); or, with pre_da, what chunk_mm_tc (kda_chunk_tc.cu) computed: dQg, dKg, dW already in the scratch.
    __device__ __forceinline__ void v_products(const float* __restrict__ pre_da,
                                               const float* __restrict__ pre_dgl) const {
        if (pre_da != nullptr) {
            // The products over V came from chunk_mm_tc (kda_chunk_tc.cu): dQg, dKg, dW already in the scratch.
            for (int e = tid; e < c * c; e += nt) sda[e] = pre_da[cc_off(d, cb) + e];
            for (int x = tid; x < kd; x += nt) sdgl[x] = pre_dgl[cb * kd + x];
        } else {
            // dA = tril(dO Vn^T)
            for (int e = warp; e < c * c; e += warps) {
                const int i = e / c, j = e % c;
                float acc = 0.0f;
                if (j <= i && valid(i)) {
                    for (int y = lane; y < vd; y += 32) acc += doat(i, y) * vn[j * vd + y];
                    acc = warp_sum(acc);
                }
                if (lane == 0) sda[e] = acc;
            }
            // dQg = dO h^T, dKg = Vn dS^T, dW = -dVn h^T
            for (int e = warp; e < c * kd; e += warps) {
                const int i = e / kd, x = e % kd;
                float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
                for (int y = lane; y < vd; y += 32) {
                    const float hxy = hh[x * vd + y];
                    a1 += doat(i, y) * hxy;
                    a2 += vn[i * vd + y] * ds[x * vd + y];
                    a3 += dvn[i * vd + y] * hxy;
                }
                a1 = warp_sum(a1);
                a2 = warp_sum(a2);
                a3 = warp_sum(a3);
                if (lane == 0) {
                    dqg[e] = a1;
                    dkg[e] = a2;
                    dw[e] = -a3;
                }
            }
            for (int x = warp; x < kd; x += warps) {
                float acc = 0.0f;
                for (int y = lane; y < vd; y += 32) acc += hh[x * vd + y] * ds[x * vd + y];
                acc = warp_sum(acc);
                if (lane == 0) sdgl[x] = expf(gam[(c - 1) * kd + x]) * acc;
            }
        }
    }

    // kda.md §4.6 step 4: dXw = T^T dW, dXu = T^T dVn, dT = dW Xw^T + dVn Xu^T (Xu = Diag(beta) V); on tensor cores
    // as 3xTF32 when tc (kda_intra_tc.cuh), else the fp32 loops.
    __device__ __forceinline__ void t_products(bool tc) const {
        if (tc) {
            dt_tc<T, true>(v, d, b, hv, t0, tm, dw, dvn, xw, sbeta, dxw, dxu, sdt);
        } else {
            for (int e = tid; e < c * kd; e += nt) {
                const int i = e / kd, x = e % kd;
                float acc = 0.0f;
                for (int j = i; j < c; ++j) acc += tm[j * c + i] * dw[j * kd + x];
                dxw[e] = acc;
            }
            for (int e = tid; e < c * vd; e += nt) {
                const int i = e / vd, y = e % vd;
                float acc = 0.0f;
                for (int j = i; j < c; ++j) acc += tm[j * c + i] * dvn[j * vd + y];
                dxu[e] = acc;
            }
            for (int e = warp; e < c * c; e += warps) {
                const int i = e / c, j = e % c;
                float acc = 0.0f, acc2 = 0.0f;
                for (int x = lane; x < kd; x += 32) acc += dw[i * kd + x] * xw[j * kd + x];
                for (int y = lane; y < vd; y += 32) acc2 += dvn[i * vd + y] * (sbeta[j] * vat(j, y));
                acc = warp_sum(acc);
                acc2 = warp_sum(acc2);
                if (lane == 0) sdt[e] = acc + acc2;
            }
        }
    }

    // kda.md §4.6 step 4: T^T dT, then dL = -strict_tril(T^T dT T^T) into sdt.
    __device__ __forceinline__ void dl(bool tc) const {
        if (tc) {
            tdt_tc<true>(d, tm, sdt, stmp);
        } else {
            for (int e = tid; e < c * c; e += nt) {
                const int i = e / c, j = e % c;
                float acc = 0.0f;
                for (int l = i; l < c; ++l) acc += tm[l * c + i] * sdt[l * c + j];
                stmp[e] = acc;
            }
            __syncthreads();
            for (int e = tid; e < c * c; e += nt) {
                const int i = e / c, j = e % c;
                float acc = 0.0f;
                if (j < i)
                    for (int l = 0; l <= j; ++l) acc += stmp[i * c + l] * tm[j * c + l];
                sdt[e] = j < i ? -acc : 0.0f;
            }
        }
    }

    // L = Diag(beta) M: dbeta_i = sum_j dL_ij M_ij, dM = Diag(beta) dL. A warp per row, the lanes over j (a thread per
    // row read M's rows from global memory one element at a time, and dL's rows with 32-way bank conflicts).
    __device__ __forceinline__ void dm_dbeta() const {
        for (int i = warp; i < c; i += warps) {
            float acc = 0.0f;
            for (int j = lane; j < i; j += 32) {
                acc += sdt[i * c + j] * m[i * c + j];
                sdt[i * c + j] *= sbeta[i];
            }
            acc = warp_sum(acc);
            if (lane == 0) sdb[i] = acc;
        }
    }

    // kda.md §4.6 step 4: dbeta from Xw and Xu; the last row's dGamma from Kg.
    __device__ __forceinline__ void dbeta_dgl() const {
        for (int r = warp; r < c; r += warps) {
            float db = 0.0f;
            for (int x = lane; x < kd; x += 32) db += dxw[r * kd + x] * kat(r, x) * expf(gam[r * kd + x]);
            for (int y = lane; y < vd; y += 32) db += dxu[r * vd + y] * vat(r, y);
            db = warp_sum(db);
            if (lane == 0) sdb[r] += db;
        }
        for (int x = tid; x < kd; x += nt) {
            float acc = sdgl[x];
            // kg exact (the workspace's Kg is rounded to TF32 on the tensor-core path), as prep forms it.
            for (int r = 0; r < c; ++r)
                acc += dkg[r * kd + x] * (kat(r, x) * expf(gam[(c - 1) * kd + x] - gam[r * kd + x]));
            sdgl[x] = acc;
        }
    }

    // kda.md §4.6 step 4, the elementwise factors: dq = dQg e^G, dk = dKg e^(G_last - G) + beta dXw e^G, dGamma;
    // dv = beta dXu.
    __device__ __forceinline__ void elementwise(T* __restrict__ dv) const {
        for (int e = tid; e < c * kd; e += nt) {
            const int r = e / kd, x = e % kd;
            const float g = gam[e], ev = expf(g), fk = expf(gam[(c - 1) * kd + x] - g);
            const float a = dqg[e], bk = dkg[e], cw = dxw[e];
            dqg[e] = a * ev;
            dkg[e] = bk * fk + sbeta[r] * cw * ev;
            float dgm = a * (qat(r, x) * ev) - bk * (kat(r, x) * fk) + cw * xw[e];  // qg, kg exact, as prep forms them
            if (r == c - 1) dgm += sdgl[x];
            dxw[e] = dgm;
        }
        for (int e = tid; e < c * vd; e += nt) {
            const int r = e / vd, y = e % vd;
            if (valid(r)) dv[v_row(d, b, t0 + r, hv) + y] = from_f32<T>(dxu[e] * sbeta[r]);
        }
    }

    // kda.md §4.6 step 5, the intra-chunk terms: on tensor cores (kda_intra_tc.cuh) when the chunk is within the
    // anchors' bound; else pairwise, rows (dq_i, dk_i, dGamma_i from A_ij and M_ij, j <= i), then columns (dk_j,
    // dGamma_j from A_ij and M_ij, i >= j).
    __device__ __forceinline__ void intra(bool tc) const {
        const bool done = tc && intra_tc<T, true>(q, k, d, b, h, t0, gam, sda, sdt, dqg, dkg, dxw);
        for (int e = tid; e < c * kd && !done; e += nt) {
            const int i = e / kd, x = e % kd;
            if (!valid(i)) continue;
            const float gi = gam[e], qi = qat(i, x), ki = kat(i, x);
            float aq = 0.0f, ak = 0.0f, ag = 0.0f;
            for (int j = 0; j <= i; ++j) {
                const float f = expf(gi - gam[j * kd + x]), kj = kat(j, x);
                const float ta = sda[i * c + j] * f, tk = sdt[i * c + j] * f;
                aq += ta * kj;
                ak += tk * kj;
                ag += (ta * qi + tk * ki) * kj;
            }
            dqg[e] += aq;
            dkg[e] += ak;
            dxw[e] += ag;
        }
        __syncthreads();
        // Columns: dk_j, dGamma_j from A_ij and M_ij (i >= j).
        for (int e = tid; e < c * kd && !done; e += nt) {
            const int j = e / kd, x = e % kd;
            if (!valid(j)) continue;
            const float gj = gam[e], kj = kat(j, x);
            float bk = 0.0f, bg = 0.0f;
            for (int i = j; i < c; ++i) {
                const float f = expf(gam[i * kd + x] - gj);
                const float s = sda[i * c + j] * f * qat(i, x) + sdt[i * c + j] * f * kat(i, x);
                bk += s;
                bg += s * kj;
            }
            dkg[e] += bk;
            dxw[e] -= bg;
        }
        __syncthreads();
    }

    // kda.md §4.6 step 6: dg = reverse cumsum of dGamma inside the chunk; dq, dk per value head; dbeta.
    __device__ __forceinline__ void store(T* __restrict__ dq,
                                          T* __restrict__ dk,
                                          T* __restrict__ dg,
                                          T* __restrict__ dbeta,
                                          float* __restrict__ dqh,
                                          float* __restrict__ dkh) const {
        for (int x = tid; x < kd; x += nt) {
            float acc = 0.0f;
            for (int r = c - 1; r >= 0; --r) {
                acc += dxw[r * kd + x];
                if (valid(r)) dg[g_row(d, b, t0 + r, hv) + x] = from_f32<T>(acc);
            }
        }
        for (int e = tid; e < c * kd; e += nt) {
            const int r = e / kd, x = e % kd;
            if (!valid(r)) continue;
            if (d.group == 1) {  // one value head per key head: dq, dk directly (the group kernel is skipped)
                dq[g_row(d, b, t0 + r, hv) + x] = from_f32<T>(dqg[e]);
                dk[g_row(d, b, t0 + r, hv) + x] = from_f32<T>(dkg[e]);
            } else {
                dqh[g_row(d, b, t0 + r, hv) + x] = dqg[e];
                dkh[g_row(d, b, t0 + r, hv) + x] = dkg[e];
            }
        }
        for (int r = tid; r < c; r += nt)
            if (valid(r)) dbeta[beta_at(d, b, t0 + r, hv)] = from_f32<T>(sdb[r]);
    }
};

}  // namespace mt::ops::cuda::kda
