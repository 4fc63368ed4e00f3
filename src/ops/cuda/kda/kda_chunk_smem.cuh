// The phases of chunk_smem_kernel (kda_chunk_smem.cu), the KDA backward chunk step (kda.md §4.6 steps 4-6) of one
// (chunk, unit) with every operand in shared memory: ChunkSmem holds the block's indices and its shared-memory tiles,
// and each member function is one phase; the kernel calls them in order, with the barriers between them. Every
// member is inlined into the kernel (the phases share registers: dk, dGamma and the dbeta partial sums live across
// them), so the split costs nothing at run time.
#pragma once

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"

namespace mt::ops::cuda::kda::chunk_smem {

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

// One block's (chunk, unit): kC the chunk size.
template <typename T, int kC>
struct ChunkSmem {
    using L = Layout<kC>;
    // The products run as 3xTF32 (split operands, about fp32 precision): with plain TF32 the floor gate's dg measured
    // 1.8e-2 against a 1e-2 budget (docs/kda.md), so the one-TF32 variant was deleted.
    static constexpr bool kSplit = true;
    static constexpr int c = kC, nsub = kC / 16, nct = kC / 8, kd = kK, vd = kV;
    static constexpr int nz = nsub * (nsub + 1);  // dT tiles in use (phase 1)
    static constexpr int nt = nsub / 2;           // row tiles of a warp in phase 3
    // Phase 3's warp (pq, rs) owns the 16 key channels of groups 2 pq, 2 pq + 1 and the row tiles rs, nsub - 1 - rs.
    static_assert(kK == 16 * (kWarps / 2) && nsub % 2 == 0, "phase 3 maps 16 warps onto 8 channel pairs x 2 tile sets");

    const Dims& d;
    const int tid, warp, lane, g, t;
    const int n, unit, b, hv, h, t0;
    const int64_t cb;
    float *const st, *const sa, *const sd, *const sw, *const sv, *const sg;
    float *const sbeta, *const sdbl, *const sdgl, *const sdbp;
    T *const sq, *const sk, *const svv;
    float* const sx;  // T^T dT once dVn is dead
    const int pq, rs;

    __device__ __forceinline__ ChunkSmem(float* sm, const Dims& dims)
        : d(dims),
          tid(threadIdx.x),
          warp(tid / 32),
          lane(tid % 32),
          g(lane / 4),
          t(lane % 4),
          n(blockIdx.x),
          unit(blockIdx.y),
          b(unit / d.hv),
          hv(unit % d.hv),
          h(hv / d.group),
          t0(n * c),
          cb(chunk_index(d, unit, n)),
          st(sm + L::t_off),
          sa(sm + L::a_off),
          sd(sm + L::d_off),
          sw(sm + L::w_off),
          sv(sm + L::v_off),
          sg(sm + L::g_off),
          sbeta(sm + L::misc_off),
          sdbl(sbeta + kMaxChunk),
          sdgl(sdbl + kMaxChunk),
          sdbp(sdgl + kK),
          sq(reinterpret_cast<T*>(sm + L::h_off)),
          sk(sq + c * L::ldh),
          svv(sk + c * L::ldh),
          sx(sv),
          pq(warp % (kWarps / 2)),
          rs(warp / (kWarps / 2)) {}

    __device__ __forceinline__ bool valid(int r) const {
        return t0 + r < d.t;
    }
    // Phase 3's row tile i of this warp.
    __device__ __forceinline__ int tile_of(int i) const {
        return i == 0 ? rs : nsub - 1 - rs;
    }

    // Stages T, dW, dVn, Gamma, q, k, v (cp.async), beta and the last row's dGamma term (kda_chunk_tc.cu's dgl), then
    // turns Gamma into base 2: every factor e^(Gamma_a - Gamma_b) below is one exp2 of a difference.
    __device__ __forceinline__ void stage(const T* __restrict__ q,
                                          const T* __restrict__ k,
                                          const T* __restrict__ v,
                                          const T* __restrict__ beta,
                                          const Work& w,
                                          const float* __restrict__ dvns,
                                          const float* __restrict__ dws,
                                          const float* __restrict__ dgls) const {
        stage_async(st, L::ldt, w.tm + cc_off(d, cb), c, c, c);
        stage_async(sw, L::ldw, dws + ck_off(d, cb), kd, c, kd);
        stage_async(sv, L::ldv, dvns + cv_off(d, cb), vd, c, vd);
        stage_async(sg, L::ldg, w.gam + ck_off(d, cb), kd, c, kd);
        stage_rows(sq, L::ldh, q, d, b, t0, d.h, h, kd);
        stage_rows(sk, L::ldh, k, d, b, t0, d.h, h, kd);
        stage_rows(svv, L::ldh, v, d, b, t0, d.hv, hv, vd);
        cp_async_commit();
        for (int r = tid; r < c; r += kBlock) sbeta[r] = valid(r) ? to_f32(beta[beta_at(d, b, t0 + r, hv)]) : 0.0f;
        for (int x = tid; x < kd; x += kBlock) sdgl[x] = dgls[cb * kd + x];
        cp_async_wait<0>();
        __syncthreads();
        for (int e = tid; e < c * kd; e += kBlock) sg[(e / kd) * L::ldg + e % kd] *= kLog2e;
        __syncthreads();
    }

    // kda.md §4.2: whether every 16-row tile is within anchor_ok (kda_mma.cuh), as the anchored products need.
    __device__ __forceinline__ bool in_anchor_bound() const {
        bool ok = true;
        for (int e = tid; e < nsub * kd; e += kBlock) {
            const int s = e / kd, x = e % kd;
            float mx = 0.0f;
            for (int r = s * 16; r < s * 16 + 16; ++r)
                mx = fmaxf(mx, fmaxf(fabsf(to_f32(sq[r * L::ldh + x])), fabsf(to_f32(sk[r * L::ldh + x]))));
            ok = ok && anchor_ok((sg[(s * 16) * L::ldg + x] - sg[(s * 16 + 15) * L::ldg + x]) / kLog2e, mx);
        }
        return __syncthreads_and(ok) != 0;
    }

    // dbeta partial sums of this lane's rows (tile i, row g or g + 8), over its columns of dXu v (phase 1) and of
    // dXw k e^Gamma (phase 3); each phase leaves its warp's row sums in dst (lanes t summed by shuffles).
    __device__ __forceinline__ void flush_dbeta(float (&p)[nsub][2], float* dst) const {
#pragma unroll
        for (int mt = 0; mt < nsub; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const float s = quad_sum(p[mt][hf]);
                if (t == 0) dst[warp * kMaxChunk + mt * 16 + 8 * hf + g] = s;
            }
    }

    // Row tile m0 and first column n0 of the dT tile in use j (row tile m0 / 16 holds m0 / 8 + 2 of them), in the
    // order of decreasing work for T^T dT: row tiles first to last.
    __device__ __forceinline__ static void dt_tile(int j, int& m0, int& n0) {
        m0 = 0;
        while (j >= m0 / 8 + 2) {
            j -= m0 / 8 + 2;
            m0 += 16;
        }
        n0 = j * 8;
    }

    // Phase 1, kda.md §4.6 step 4: dT = dW Xw^T + dVn Xu^T at the tiles (m0, n0) with n0 < m0 + 16 (only dT's strictly
    // lower part reaches dL, and the tiles of T^T dT that dL reads use no others), Xw = Diag(beta) k e^Gamma rebuilt
    // from k, Gamma, beta. Each tile is two half jobs, dW Xw^T into sd and dVn Xu^T into sa (dA is loaded there
    // later), round robin over the warps; dxu_dv below runs on the warps that got one half job fewer: at c = 64, 40
    // half jobs (16 k-steps of 3xTF32) and 16 groups (20 k-steps of plain TF32) as three half jobs on warps 0-7, two
    // half jobs and two groups on warps 8-15 (with one list, warps 0-7 took three half jobs and a group).
    __device__ __forceinline__ void dt_tiles() const {
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
                        mma_tf32(acc, al, bv);  // the low part's term (3xTF32)
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
    }

    // Phase 1, kda.md §4.6 step 4: dXu = T^T dVn by groups of 8 value columns, dv = beta dXu straight to global
    // memory, and dXu . v into this lane's dbeta partial sums dbp.
    __device__ __forceinline__ void dxu_dv(T* __restrict__ dv, float (&dbp)[nsub][2]) const {
        constexpr int rem = (2 * nz) % kWarps;  // warps rem.. have one half job fewer
        const int ngv = vd / 8;
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
    }

    // M's rows for dbeta's L term (dm_dbeta), loaded before phase 2 so that the global round trip overlaps the T^T dT
    // products: warp w takes rows w + 16 ri, its lanes the columns lane + 32 h.
    __device__ __forceinline__ void load_m_rows(const Work& w, float (&mrow)[c / kWarps][c / 32]) const {
        const float* m = w.m + cc_off(d, cb);
#pragma unroll
        for (int ri = 0; ri < c / kWarps; ++ri)
#pragma unroll
            for (int hh = 0; hh < c / 32; ++hh) mrow[ri][hh] = m[(warp + ri * kWarps) * c + lane + 32 * hh];
    }

    // Phase 2, kda.md §4.6 step 4: T^T dT into sx, the tiles n0 < m0 + 16 only (all that dl reads). The tiles in use
    // by decreasing work ((c - m0) / 8 k-steps), the first kWarps one per warp and the rest (the cheapest) to the last
    // warps, which took the cheapest first (at c = 64 the largest load is 8 k-steps, not 12).
    __device__ __forceinline__ void tt_dt() const {
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
    }

    // dA (from chunk_mm_tc) into sa, needed from phase 3 on: issued now, waited for after dm_dbeta.
    __device__ __forceinline__ void stage_da(const Work& w) const {
        stage_async(sa, L::ldc, w.a + cc_off(d, cb), c, c, c);
        cp_async_commit();
    }

    // Phase 2, kda.md §4.6 step 4: dL = -strict_tril(T^T dT T^T) into sd (T_jl = 0 for l > j).
    __device__ __forceinline__ void dl() const {
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
    }

    // Phase 2, kda.md §4.6 step 4 (L = Diag(beta) M): dbeta_i = sum_j dL_ij M_ij into sdbl, dM = Diag(beta) dL in place
    // of dL (a warp per row).
    __device__ __forceinline__ void dm_dbeta(const float (&mrow)[c / kWarps][c / 32]) const {
#pragma unroll
        for (int ri = 0; ri < c / kWarps; ++ri) {
            const int i = warp + ri * kWarps;
            float acc = 0.0f;
#pragma unroll
            for (int hh = 0; hh < c / 32; ++hh) {
                const int j = lane + 32 * hh;
                if (j < i) {
                    acc += sd[i * L::ldc + j] * mrow[ri][hh];
                    sd[i * L::ldc + j] *= sbeta[i];
                }
            }
            acc = warp_sum(acc);
            if (lane == 0) sdbl[i] = acc;
        }
    }

    // dA and dM are the A operands of every warp's intra-chunk products: split them into TF32 parts once (the high
    // parts in place, the low parts where dVn was).
    __device__ __forceinline__ void split_operands() const {
        uint32_t* la = reinterpret_cast<uint32_t*>(sv);
        split_tile_tf32<kSplit>(sa, la, L::ldc, c, c);
        split_tile_tf32<kSplit>(sd, la + c * L::ldc, L::ldc, c, c);
    }

    // Phase 3's tile registers: the tile loops stay rolled (the kernel's code has to fit the instruction cache), so
    // each pass works on okc, ogc (dk, dGamma of its tile) and copies them to or from its tile's registers.
    __device__ __forceinline__ static void put(
        int i, float (&ok_)[nt][2][4], float (&og)[nt][2][4], const float (&okc)[2][4], const float (&ogc)[2][4]) {
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    ok_[ii][e / 4][e % 4] = okc[e / 4][e % 4];
                    og[ii][e / 4][e % 4] = ogc[e / 4][e % 4];
                }
    }
    __device__ __forceinline__ static void get(
        int i, const float (&ok_)[nt][2][4], const float (&og)[nt][2][4], float (&okc)[2][4], float (&ogc)[2][4]) {
#pragma unroll
        for (int ii = 0; ii < nt; ++ii)
            if (ii == i)
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    okc[e / 4][e % 4] = ok_[ii][e / 4][e % 4];
                    ogc[e / 4][e % 4] = og[ii][e / 4][e % 4];
                }
    }

    // dq or dk of this lane's two rows of tile m0 in group gi: the activation dtype, or fp32 per value head (GVA).
    __device__ __forceinline__ void store_rows(T* out, float* out_h, int m0, int gi, const float (&o)[4]) const {
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
    }

    // Phase 3, rows (kda.md §4.6 steps 4-5): defined in kda_chunk_smem.cu.
    __device__ __forceinline__ void rows(const float* __restrict__ dqgs,
                                         const float* __restrict__ dkgs,
                                         T* __restrict__ dq,
                                         float* __restrict__ dqh,
                                         float (&ok_)[nt][2][4],
                                         float (&og)[nt][2][4],
                                         float (&dbp3)[nt][2],
                                         float (&glp)[2][2]) const;

    // Phase 3, columns (kda.md §4.6 step 5): defined in kda_chunk_smem.cu.
    __device__ __forceinline__ void columns(T* __restrict__ dk,
                                            float* __restrict__ dkh,
                                            float (&ok_)[nt][2][4],
                                            float (&og)[nt][2][4]) const;

    // kda.md §4.6 step 6 inside the tiles, and phase 3's dbeta sums: defined in kda_chunk_smem.cu.
    __device__ __forceinline__ void dg_tiles(float (&og)[nt][2][4],
                                             const float (&glp)[2][2],
                                             const float (&dbp3)[nt][2]) const;

    // kda.md §4.6 step 6 across the tiles, dg stored: defined in kda_chunk_smem.cu.
    __device__ __forceinline__ void dg_store(T* __restrict__ dg, float (&og)[nt][2][4]) const;

    // dbeta = the L term + the per-warp partial sums of phases 1 and 3, in warp order.
    __device__ __forceinline__ void dbeta_store(T* __restrict__ dbeta) const {
        for (int r = tid; r < c; r += kBlock) {
            float s = sdbl[r];
            for (int wp = 0; wp < 2 * kWarps; ++wp) s += sdbp[wp * kMaxChunk + r];
            if (valid(r)) dbeta[beta_at(d, b, t0 + r, hv)] = from_f32<T>(s);
        }
    }
};

}  // namespace mt::ops::cuda::kda::chunk_smem
