// CUDA KDA backward (kda.md §4.6), first straightforward version, fp32 math. Kernels, in order:
//   prep + scan (kda.cu): recompute the chunk quantities, then the forward scan storing the state entering each
//         chunk (hs) and Vn.
//   rscan: one block per (16 value columns, unit), chunks last to first, dS columns in shared memory: stores dS (the
//         gradient of the state leaving the chunk), dVn = A^T dO + Kg dS, then dS <- Diag(gamma) dS + Qg^T dO - W^T
//         dVn; the last dS is dS_0.
//   chunk: one block per (chunk, unit), chunks in parallel: dA, dQg, dKg, dW, dXw = T^T dW, dXu = T^T dVn, dT,
//         dL = -strict_tril(T^T dT T^T), the elementwise factors, the pairwise intra-chunk terms (rows, then
//         columns: each output element has one writer), the reverse cumsum to dg; dv, dg, dbeta written; dq and dk
//         too when HV = H, else per value head into fp32 buffers for:
//   group (HV > H only): dq, dk = sum over the value heads of a GVA group, in head order.
// For bf16/f16 inputs (kda::use_tc) prep, the scans and most of chunk run on tensor cores instead: kda_prep_tc.cu,
// kda_scan_tc.cu, kda_chunk_tc.cu (products over V) and kda_intra_tc.cuh (products over T, intra-chunk terms).
// Deterministic: fixed loop orders, no atomics.
#include "ops/cuda/kda_common.cuh"
#include "ops/cuda/kda_intra_tc.cuh"
#include "ops/cuda/kda_mma.cuh"
#include "ops/kda.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace kda {

namespace {

// Per-chunk fp32 scratch of the chunk kernel: dqg, dkg, dw, dxw [C, K] (become dq, dk, -, dGamma), dxu [C, V].
struct Scratch {
    float *dqg, *dkg, *dw, *dxw, *dxu;
};

template <typename T>
__device__ __forceinline__ float ld(const T* p, int64_t i, bool valid) {
    return valid ? to_f32(p[i]) : 0.0f;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rscan_kernel(const T* __restrict__ dout,
                                                         const float* __restrict__ dst,
                                                         float* __restrict__ ds0,
                                                         Dims d,
                                                         Work w,
                                                         float* dhs,
                                                         float* dvns) {
    extern __shared__ float smem[];
    float* ds = smem;                          // [kd, kBV]
    float* sdo = ds + d.k * kBV;               // [c, kBV]
    float* sdvn = sdo + kMaxChunk * kBV;       // [c, kBV]
    float* t1 = sdvn + kMaxChunk * kBV;        // [c, kd]: Kg, then Qg
    float* t2 = t1 + kMaxChunk * d.k;          // [c, kd]: W
    float* sa = t2 + kMaxChunk * d.k;          // [c, c] A
    float* sgam = sa + kMaxChunk * kMaxChunk;  // [kd] gamma
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * kBV, tid = threadIdx.x;
    const int c = d.c, kd = d.k, vd = d.v, bv = min(kBV, vd - y0);
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    for (int e = tid; e < kd * kBV; e += blockDim.x) {
        const int x = e / kBV, yl = e % kBV;
        ds[e] = (dst != nullptr && yl < bv) ? dst[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] : 0.0f;
    }
    __syncthreads();
    for (int n = d.nc - 1; n >= 0; --n) {
        const int64_t cb = chunk_index(d, unit, n);
        const float* gam = w.gam + ck_off(d, cb);
        for (int e = tid; e < kd * bv; e += blockDim.x) {
            const int x = e / bv, yl = e % bv;
            dhs[cb * kv + static_cast<int64_t>(x) * vd + y0 + yl] = ds[x * kBV + yl];
        }
        stage(t1, w.kg + ck_off(d, cb), c * kd);
        stage(t2, w.w + ck_off(d, cb), c * kd);
        stage(sa, w.a + cc_off(d, cb), c * c);
        for (int x = tid; x < kd; x += blockDim.x) sgam[x] = expf(gam[(c - 1) * kd + x]);
        for (int e = tid; e < c * kBV; e += blockDim.x) {
            const int i = e / kBV, yl = e % kBV, t = n * c + i;
            sdo[e] = ld(dout, v_row(d, b, t < d.t ? t : 0, hv) + y0 + yl, t < d.t && yl < bv);
        }
        __syncthreads();
        // dVn = A^T dO + Kg dS
        for (int e = tid; e < c * kBV; e += blockDim.x) {
            const int i = e / kBV, yl = e % kBV;
            if (yl >= bv) {
                sdvn[e] = 0.0f;
                continue;
            }
            float acc = 0.0f;
            for (int j = i; j < c; ++j) acc += sa[j * c + i] * sdo[j * kBV + yl];
            float acc2 = 0.0f;
            for (int x = 0; x < kd; ++x) acc2 += t1[i * kd + x] * ds[x * kBV + yl];
            const float dvn = acc + acc2;
            sdvn[e] = dvn;
            dvns[cv_off(d, cb) + static_cast<int64_t>(i) * vd + y0 + yl] = dvn;
        }
        __syncthreads();
        stage(t1, w.qg + ck_off(d, cb), c * kd);
        __syncthreads();
        // dS <- Diag(gamma) dS + Qg^T dO - W^T dVn
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, yl = e % kBV;
            if (yl >= bv) continue;
            float acc = 0.0f, acc2 = 0.0f;
            for (int i = 0; i < c; ++i) {
                acc += t1[i * kd + x] * sdo[i * kBV + yl];
                acc2 += t2[i * kd + x] * sdvn[i * kBV + yl];
            }
            ds[e] = (ds[e] * sgam[x] + acc) - acc2;
        }
        __syncthreads();
    }
    if (ds0 != nullptr)
        for (int e = tid; e < kd * bv; e += blockDim.x) {
            const int x = e / bv, yl = e % bv;
            ds0[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] = ds[x * kBV + yl];
        }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) chunk_kernel(const T* __restrict__ q,
                                                         const T* __restrict__ k,
                                                         const T* __restrict__ v,
                                                         const T* __restrict__ beta,
                                                         const T* __restrict__ dout,
                                                         Dims d,
                                                         Work w,
                                                         const float* __restrict__ hs,
                                                         const float* __restrict__ vns,
                                                         const float* __restrict__ dvns,
                                                         const float* __restrict__ dhs,
                                                         Scratch sc,
                                                         const float* __restrict__ pre_da,
                                                         const float* __restrict__ pre_dgl,
                                                         float* __restrict__ dqh,
                                                         float* __restrict__ dkh,
                                                         T* __restrict__ dq,
                                                         T* __restrict__ dk,
                                                         T* __restrict__ dv,
                                                         T* __restrict__ dg,
                                                         T* __restrict__ dbeta,
                                                         bool intra,
                                                         bool dtc,
                                                         bool split,
                                                         const int* __restrict__ only,
                                                         bool fill_xw,
                                                         PhaseClock pc) {
    // With chunk_smem_kernel in front, only the chunks it left (only[cb] != 0) are done here.
    if (only != nullptr && only[chunk_index(d, blockIdx.y, blockIdx.x)] == 0) return;
    extern __shared__ float smem[];
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x, nt = blockDim.x;
    float* sda = smem;               // dA [c, c]
    float* sdt = sda + c * c;        // dT, then dM
    float* stmp = sdt + c * c;       // T^T dT
    float* sbeta = stmp + c * c;     // [kMaxChunk]
    float* sdb = sbeta + kMaxChunk;  // dbeta [kMaxChunk]
    float* sdgl = sdb + kMaxChunk;   // dGamma of the last row [kd]
    const int n = blockIdx.x, unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, h = hv / d.group, t0 = n * c;
    const int64_t cb = chunk_index(d, unit, n), kv = static_cast<int64_t>(kd) * vd;
    const float* gam = w.gam + ck_off(d, cb);
    float* xw = w.xw + ck_off(d, cb);
    const float* m = w.m + cc_off(d, cb);
    const float* tm = w.tm + cc_off(d, cb);
    const float* hh = hs + cb * kv;   // state entering the chunk [kd, vd]
    const float* ds = dhs + cb * kv;  // gradient of the state leaving it
    const float* vn = vns + cv_off(d, cb);
    const float* dvn = dvns + cv_off(d, cb);
    float* dqg = sc.dqg + ck_off(d, cb);
    float* dkg = sc.dkg + ck_off(d, cb);
    float* dw = sc.dw + ck_off(d, cb);
    float* dxw = sc.dxw + ck_off(d, cb);
    float* dxu = sc.dxu + cv_off(d, cb);
    auto valid = [&](int r) { return t0 + r < d.t; };
    auto row = [&](int r) { return valid(r) ? t0 + r : 0; };
    auto qat = [&](int r, int x) { return ld(q, qk_row(d, b, row(r), h) + x, valid(r)); };
    auto kat = [&](int r, int x) { return ld(k, qk_row(d, b, row(r), h) + x, valid(r)); };
    auto vat = [&](int r, int y) { return ld(v, v_row(d, b, row(r), hv) + y, valid(r)); };
    auto doat = [&](int r, int y) { return ld(dout, v_row(d, b, row(r), hv) + y, valid(r)); };
    pc.mark(0);
    for (int r = tid; r < c; r += nt) sbeta[r] = ld(beta, beta_at(d, b, row(r), hv), valid(r));
    if (fill_xw) {
        // The forward kept Gamma, Qg, Kg and W but not Xw, which only this kernel reads: formed here, as prep_tc
        // forms it (the same product, bit for bit), and read back by this block after the barrier.
        __syncthreads();
        for (int e = tid; e < c * kd; e += nt) xw[e] = sbeta[e / kd] * kat(e / kd, e % kd) * expf(gam[e]);
        __syncthreads();
    }
    // The products over V: one warp per output, the lanes over the value columns (coalesced rows).
    const int warp = tid / 32, lane = tid % 32, warps = nt / 32;
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
    __syncthreads();
    pc.mark(1);
    // dXw = T^T dW, dXu = T^T dVn, dT = dW Xw^T + dVn Xu^T (Xu = Diag(beta) V)
    // (tensor cores when dtc: kda_intra_tc.cuh)
    if (dtc) {
        if (split)
            dt_tc<T, true>(v, d, b, hv, t0, tm, dw, dvn, xw, sbeta, dxw, dxu, sdt);
        else
            dt_tc<T, false>(v, d, b, hv, t0, tm, dw, dvn, xw, sbeta, dxw, dxu, sdt);
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
    __syncthreads();
    pc.mark(2);
    // T^T dT, then dL = -strict_tril(T^T dT T^T) into sdt
    if (dtc) {
        if (split)
            tdt_tc<true>(d, tm, sdt, stmp);
        else
            tdt_tc<false>(d, tm, sdt, stmp);
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
    __syncthreads();
    pc.mark(3);
    // L = Diag(beta) M: dbeta_i = sum_j dL_ij M_ij, dM = Diag(beta) dL. A warp per row, the lanes over j (a thread
    // per row read M's rows from global memory one element at a time, and dL's rows with 32-way bank conflicts).
    for (int i = warp; i < c; i += warps) {
        float acc = 0.0f;
        for (int j = lane; j < i; j += 32) {
            acc += sdt[i * c + j] * m[i * c + j];
            sdt[i * c + j] *= sbeta[i];
        }
        acc = warp_sum(acc);
        if (lane == 0) sdb[i] = acc;
    }
    __syncthreads();
    pc.mark(4);
    // dbeta from Xw and Xu; the last row's dGamma from Kg
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
    __syncthreads();
    pc.mark(5);
    // Elementwise factors: dq = dQg e^G, dk = dKg e^(G_last - G) + beta dXw e^G, dGamma; dv = beta dXu.
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
    __syncthreads();
    pc.mark(6);
    // Intra-chunk terms on tensor cores (kda_intra_tc.cuh) when the chunk is within the anchors' bound; else
    // pairwise, rows: dq_i, dk_i, dGamma_i from A_ij and M_ij (j <= i).
    const bool done = intra && (split ? intra_tc<T, true>(q, k, d, b, h, t0, gam, sda, sdt, dqg, dkg, dxw)
                                      : intra_tc<T, false>(q, k, d, b, h, t0, gam, sda, sdt, dqg, dkg, dxw));
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
    pc.mark(7);
    // dg = reverse cumsum of dGamma inside the chunk; dq, dk per value head; dbeta.
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
    pc.mark(8);
}

// dq[b, t, h] = sum over the group's value heads hv = h * group + i, in order.
template <typename T>
__global__ void group_kernel(const float* __restrict__ dqh, const float* __restrict__ dkh, T* dq, T* dk, Dims d) {
    const int64_t total = static_cast<int64_t>(d.b) * d.t * d.h * d.k;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t x = e % d.k, bth = e / d.k, hh = bth % d.h, bt = bth / d.h;
        const int64_t src = (bt * d.hv + hh * d.group) * d.k + x;
        float aq = 0.0f, ak = 0.0f;
        for (int i = 0; i < d.group; ++i) {
            aq += dqh[src + i * d.k];
            ak += dkh[src + i * d.k];
        }
        dq[e] = from_f32<T>(aq);
        dk[e] = from_f32<T>(ak);
    }
}

}  // namespace

}  // namespace kda

void kda_bwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& dout,
             const Tensor& dst,
             const Tensor& dq,
             const Tensor& dk,
             const Tensor& dv,
             const Tensor& dg,
             const Tensor& dbeta,
             const Tensor& ds0,
             const ops::KdaOptions& options,
             const ops::KdaSaved* saved) {
    constexpr std::string_view op = "kda_bwd";
    kda_check_dtypes(q,
                     k,
                     v,
                     g,
                     beta,
                     {{"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}, {"dbeta", dbeta}},
                     {{"s0", s0}, {"dst", dst}, {"ds0", ds0}},
                     options.chunk_size,
                     op);
    core::NvtxRange range("kda_bwd");
    kda::Profile prof("bwd");
    const kda::Dims d = kda_dims(q, v, options.chunk_size);
    const kda::Plan plan = kda::make_plan(d, q.dtype(), options.kernels);
    if (options.chosen != nullptr) *options.chosen = kda::plan_name(plan, true);
    const bool tc = plan.tc;
    // What the forward kept (ops::KdaSaved; it fills one only on this path): A, M, T, maybe hs and Vn, maybe Gamma,
    // Qg, Kg and W too. Read only: the buffers below that would overwrite them get their own memory instead.
    const bool tiles_in = saved != nullptr && saved->has_tiles() && tc;
    const bool states_in = tiles_in && saved->has_states(), ws_in = states_in && saved->has_workspace();
    auto mut = [](const Tensor& t) { return const_cast<float*>(t.data<float>()); };
    kda::Work given{};
    if (tiles_in) {
        given.a = mut(saved->a);
        given.m = mut(saved->m);
        given.tm = mut(saved->t);
    }
    if (ws_in) {
        given.gam = mut(saved->gam);
        given.qg = mut(saved->qg);
        given.kg = mut(saved->kg);
        given.w = mut(saved->w);
    }
    std::vector<Tensor> keep;
    kda::Work w = kda::work_alloc(d, keep, false, given, !states_in);
    prof.mark("alloc");
    if (tc && !ws_in)
        kda::prep_tc_launch(q, k, v, g, beta, d, w, tiles_in ? kda::PrepMode::bwd_tiles : kda::PrepMode::bwd);
    else if (!tc)
        kda::prep_launch(q, k, v, g, beta, d, w, false);
    prof.mark("prep");
    const int64_t chunks = static_cast<int64_t>(d.units()) * d.nc;
    auto alloc = [&](int64_t n) {
        keep.push_back(Tensor::scratch({n}, DType::f32, core::Device::cuda));
        return keep.back().data<float>();
    };
    const int64_t kv = static_cast<int64_t>(d.k) * d.v, cv = static_cast<int64_t>(d.c) * d.v,
                  ck = static_cast<int64_t>(d.c) * d.k;
    const float* hs = states_in ? saved->hs.data<float>() : nullptr;
    const float* vn = states_in ? saved->vn.data<float>() : nullptr;
    float* dhs = alloc(chunks * kv);
    float* dvn = alloc(chunks * cv);
    if (!states_in) {
        float* hsw = alloc(chunks * kv);
        float* vnw = alloc(chunks * cv);
        if (tc)
            kda::scan_tc_launch(q.dtype(), s0, Tensor(), Tensor(), d, w, hsw, vnw, plan.scan_bv);
        else
            kda::scan_launch(s0, Tensor(), Tensor(), d, w, hsw, vnw);
        hs = hsw;
        vn = vnw;
        prof.mark("scan");
    }
    const dim3 scan_grid(static_cast<unsigned>((d.v + kda::kBV - 1) / kda::kBV), static_cast<unsigned>(d.units()));
    const size_t rscan_smem = kda::rscan_smem_bytes(d);
    const float* dstp = dst.defined() ? dst.data<float>() : nullptr;
    float* ds0p = ds0.defined() ? ds0.data<float>() : nullptr;
    if (tc) {
        kda::rscan_tc_launch(dout, dst, ds0, d, w, dhs, dvn, plan.rscan_bv);
    } else {
        MT_CUDA_DISPATCH(q.dtype(), T, {
            MT_CUDA_CHECK(cudaFuncSetAttribute(
                kda::rscan_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(rscan_smem)));
            kda::rscan_kernel<T><<<scan_grid, kda::kThreads, rscan_smem, core::exec_stream()>>>(
                static_cast<const T*>(dout.raw()), dstp, ds0p, d, w, dhs, dvn);
        });
        MT_CUDA_CHECK(cudaGetLastError());
    }
    prof.mark("rscan");
    // W, U and A are read only by the scans: their workspace holds dXw, dXu and dA from here on (every entry is
    // written before it is read; A's zero tiles above the diagonal are the zeros dA needs there), which saves
    // allocating and zero-filling ~0.7 GB at 8 x 4096. A and U kept by the forward are not ours to overwrite: dA and
    // dXu get their own buffers then (dA's zero tiles are written by chunk_mm_tc, which covers every tile).
    if (tiles_in && plan.chunk_tc) w.a = alloc(chunks * d.c * d.c);  // chunk_mm_tc's dA
    const kda::Scratch sc{alloc(chunks * ck),
                          alloc(chunks * ck),
                          alloc(chunks * ck),
                          ws_in ? alloc(chunks * ck) : w.w,
                          w.u != nullptr ? w.u : alloc(chunks * cv)};
    float* pre_da = nullptr;
    float* pre_dgl = nullptr;
    if (plan.chunk_tc) {
        pre_da = w.a;
        pre_dgl = alloc(chunks * d.k);
        kda::chunk_mm_tc_launch(dout, d, w, hs, vn, dvn, dhs, sc.dqg, sc.dkg, sc.dw, pre_da, pre_dgl);
        prof.mark("chunk_mm");
    }
    const int64_t rows = static_cast<int64_t>(d.b) * d.t * d.hv * d.k;
    float* dqh = d.group == 1 ? nullptr : alloc(rows);
    float* dkh = d.group == 1 ? nullptr : alloc(rows);
    int* only = nullptr;
    if (plan.chunk_smem) {
        keep.push_back(Tensor::scratch({chunks}, DType::i32, core::Device::cuda));
        only = keep.back().data<int32_t>();
        kda::chunk_smem_launch(
            q, k, v, beta, d, w, dvn, sc.dqg, sc.dkg, sc.dw, pre_dgl, dqh, dkh, dq, dk, dv, dg, dbeta, only);
        prof.mark("chunk_smem");
    }
    const dim3 chunk_grid(static_cast<unsigned>(d.nc), static_cast<unsigned>(d.units()));
    const kda::PhaseLog phases("chunk", chunks);
    const size_t chunk_smem = (3 * static_cast<size_t>(d.c) * d.c + 2 * kda::kMaxChunk + d.k) * sizeof(float);
    MT_CUDA_DISPATCH(q.dtype(), T, {
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            kda::chunk_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(chunk_smem)));
        kda::chunk_kernel<T>
            <<<chunk_grid, kda::kThreads, chunk_smem, core::exec_stream()>>>(static_cast<const T*>(q.raw()),
                                                                             static_cast<const T*>(k.raw()),
                                                                             static_cast<const T*>(v.raw()),
                                                                             static_cast<const T*>(beta.raw()),
                                                                             static_cast<const T*>(dout.raw()),
                                                                             d,
                                                                             w,
                                                                             hs,
                                                                             vn,
                                                                             dvn,
                                                                             dhs,
                                                                             sc,
                                                                             pre_da,
                                                                             pre_dgl,
                                                                             dqh,
                                                                             dkh,
                                                                             static_cast<T*>(dq.raw()),
                                                                             static_cast<T*>(dk.raw()),
                                                                             static_cast<T*>(dv.raw()),
                                                                             static_cast<T*>(dg.raw()),
                                                                             static_cast<T*>(dbeta.raw()),
                                                                             tc,    // intra-chunk terms on TCs
                                                                             tc,    // dT products on TCs
                                                                             true,  // 3xTF32
                                                                             only,
                                                                             ws_in,
                                                                             phases.clock());
    });
    MT_CUDA_CHECK(cudaGetLastError());
    prof.mark("chunk");
    phases.print(9);
    if (d.group == 1) return;
    const int64_t total = static_cast<int64_t>(d.b) * d.t * d.h * d.k;
    MT_CUDA_DISPATCH(q.dtype(), T, {
        kda::group_kernel<T><<<grid_for(total, 256), 256, 0, core::exec_stream()>>>(
            dqh, dkh, static_cast<T*>(dq.raw()), static_cast<T*>(dk.raw()), d);
    });
    MT_CUDA_CHECK(cudaGetLastError());
    prof.mark("group");
}
MT_REGISTER_KERNEL(kda_bwd, cuda, kda_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
