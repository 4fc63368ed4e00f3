// The KDA backward chunk step (kda.md §4.6 steps 4-6) as one block per (chunk, unit) whose operands all sit in
// shared memory, for the inputs of the tensor-core path (kda::use_chunk_tc) at K = V = 128. It replaces, for those
// chunks, chunk_kernel's dt_tc / tdt_tc / elementwise / intra_tc / cumsum phases, which read every MMA fragment
// from the fp32 workspace in global memory and kept dq, dk, dGamma there between phases (9.6 ms at 8 x 4096).
//
// Inputs: T, dA (from chunk_mm_tc), dW and dVn (the chunk scratch), Gamma, q, k, v, beta, staged once by cp.async;
// dQg, dKg (chunk scratch) and M are read where they are used, once each. Phases (16 warps; the members of
// ChunkSmem, kda_chunk_smem.cuh, those of phase 3 and the cumsum defined here):
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
#include "ops/cuda/kda/kda_chunk_smem.cuh"
#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_intra_tc.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace chunk_smem {

// Phase 3, rows, for this warp's 16 key channels (x0 = 16 pq + 8 gi) and row tiles (tile_of): kda.md §4.6 step 4's
// dXw = T^T dW and elementwise factors (dq = dQg e^G, dk = dKg e^(G_last - G) + beta dXw e^G, dGamma = dQg qg -
// dKg kg + dXw xw), then step 5's row terms dq_i += sum_j dA_ij f_ij k_j, dk_i += sum_j dM_ij f_ij k_j (anchor: the
// tile's first row); dq stored. Each A fragment (T^T, dA, dM) serves both 8-channel groups. Leaves dk and dGamma in
// ok_, og, the dbeta partial sums of dXw k e^Gamma in dbp3 and the sums of dKg kg over this lane's rows in glp.
template <typename T, int kC>
__device__ __forceinline__ void ChunkSmem<T, kC>::rows(const float* __restrict__ dqgs,
                                                       const float* __restrict__ dkgs,
                                                       T* __restrict__ dq,
                                                       float* __restrict__ dqh,
                                                       float (&ok_)[nt][2][4],
                                                       float (&og)[nt][2][4],
                                                       float (&dbp3)[nt][2],
                                                       float (&glp)[2][2]) const {
    const uint32_t *ua = reinterpret_cast<const uint32_t*>(sa), *ud = reinterpret_cast<const uint32_t*>(sd);
    const uint32_t *la = reinterpret_cast<const uint32_t*>(sv), *ld = la + c * L::ldc;
    const float* dqg = dqgs + ck_off(d, cb);
    const float* dkg = dkgs + ck_off(d, cb);
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
        put(i, ok_, og, okc, ogc);
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i) {
                dbp3[ii][0] = dbc[0];
                dbp3[ii][1] = dbc[1];
            }
    }
}

// Phase 3, columns, kda.md §4.6 step 5: dk_j += sum_i (dA_ij q_i + dM_ij k_i) f_ij, dGamma_j -= k_j of that
// (anchor: the tile's last row); dk stored.
template <typename T, int kC>
__device__ __forceinline__ void ChunkSmem<T, kC>::columns(T* __restrict__ dk,
                                                          float* __restrict__ dkh,
                                                          float (&ok_)[nt][2][4],
                                                          float (&og)[nt][2][4]) const {
    const uint32_t *ua = reinterpret_cast<const uint32_t*>(sa), *ud = reinterpret_cast<const uint32_t*>(sd);
    const uint32_t *la = reinterpret_cast<const uint32_t*>(sv), *ld = la + c * L::ldc;
#pragma unroll 1
    for (int i = 0; i < nt; ++i) {
        const int j0 = tile_of(i) * 16, er = j0 + 15;
        float okc[2][4], ogc[2][4];
        get(i, ok_, og, okc, ogc);
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
                    const float f0 = fast_exp2(sg[r0 * L::ldg + xb] - anb);
                    const float f1 = fast_exp2(sg[r1 * L::ldg + xb] - anb);
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
        put(i, ok_, og, okc, ogc);
    }
}

// kda.md §4.6 step 6, inside the tiles: dg = reverse cumsum of dGamma over the rows. A suffix scan over g within
// each row slot (lanes g + 1, g + 2, g + 4), then slot g gets slot g + 8's total; the tile totals [nsub, K] go to
// stot and the sums of dKg kg over this warp's rows to sglp ([2, K], one per tile set): with gamma (h . dS) (from
// chunk_mm_tc) they are the last row's terms, which every row's sum includes. Then phase 3's dbeta partial sums
// (zeros in the rows of the other tile set).
template <typename T, int kC>
__device__ __forceinline__ void ChunkSmem<T, kC>::dg_tiles(float (&og)[nt][2][4],
                                                           const float (&glp)[2][2],
                                                           const float (&dbp3)[nt][2]) const {
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
}

// kda.md §4.6 step 6, across the tiles: each row adds the totals of the later tiles and the last row's terms; dg
// stored.
template <typename T, int kC>
__device__ __forceinline__ void ChunkSmem<T, kC>::dg_store(T* __restrict__ dg, float (&og)[nt][2][4]) const {
    const float* stot = sdbp + 2 * kWarps * kMaxChunk;
    const float* sglp = stot + nsub * kK;
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
}

}  // namespace chunk_smem

namespace {

using chunk_smem::ChunkSmem;
using chunk_smem::kBlock;
using chunk_smem::kK;
using chunk_smem::kV;
using chunk_smem::kWarps;
using chunk_smem::Layout;

template <typename T, int kC>
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
    using Block = ChunkSmem<T, kC>;
    constexpr int nsub = Block::nsub, nt = Block::nt;
    const Block s(sm, d);
    pc.mark(0);
    s.stage(q, k, v, beta, w, dvns, dws, dgls);
    const bool ok = s.in_anchor_bound();
    if (s.tid == 0) fallback[s.cb] = ok ? 0 : 1;
    if (!ok) return;
    pc.mark(1);
    // Phase 1 (kda.md §4.6 step 4): the dT tiles in use, dXu = T^T dVn and dv; dbeta's dXu . v partial sums.
    float dbp[nsub][2] = {};
    s.dt_tiles();
    s.dxu_dv(dv, dbp);
    s.flush_dbeta(dbp, s.sdbp);
    __syncthreads();
    pc.mark(2);
    // Phase 2 (§4.6 step 4): T^T dT, dL = -strict_tril(T^T dT T^T), dbeta's L term and dM = Diag(beta) dL.
    float mrow[kC / kWarps][kC / 32];
    s.load_m_rows(w, mrow);
    s.tt_dt();
    __syncthreads();
    s.stage_da(w);
    s.dl();
    __syncthreads();
    s.dm_dbeta(mrow);
    cp_async_wait<0>();
    __syncthreads();
    s.split_operands();
    __syncthreads();
    pc.mark(3);
    // Phase 3 (§4.6 steps 4-5): dXw, the elementwise factors and the intra-chunk terms, rows then columns; dq, dk.
    float ok_[nt][2][4], og[nt][2][4];  // dk, dGamma; dq is stored tile by tile (it has no column term)
    float dbp3[nt][2] = {};             // dbeta partial sums (dXw k e^Gamma) of this lane's rows
    float glp[2][2] = {};               // sum over this lane's rows of dKg kg, per group and column
    s.rows(dqgs, dkgs, dq, dqh, ok_, og, dbp3, glp);
    s.columns(dk, dkh, ok_, og);
    // §4.6 step 6: dg = the reverse cumsum of dGamma, inside the tiles, then across them; dbeta.
    s.dg_tiles(og, glp, dbp3);
    __syncthreads();
    pc.mark(4);
    s.dg_store(dg, og);
    s.dbeta_store(dbeta);
    pc.mark(5);
}

}  // namespace

bool chunk_smem_shapes(const Dims& d) {
    return d.k == kK && d.v == kV;
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
        kernel<<<grid, kBlock, smem, core::exec_stream()>>>(static_cast<const T*>(q.raw()),
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
        if (d.c == 64)
            run(chunk_smem_kernel<T, 64>, tag);
        else
            run(chunk_smem_kernel<T, 32>, tag);
    };
    if (q.dtype() == DType::bf16)
        by_type(bf16{});
    else
        by_type(f16{});
    MT_CUDA_CHECK(cudaGetLastError());
    phases.print(6);
}

}  // namespace mt::ops::cuda::kda
