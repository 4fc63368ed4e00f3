// Tensor-core version of the KDA chunk preparation (kda.md §4.1-4.4, `prep` of kda.cu) for the inputs kda::use_tc
// accepts (bf16/f16, K % 16 == 0, K <= 128, V % 16 == 0). One block per (chunk, unit), as the fp32 kernel, and the
// same fp32 workspace, so the scans and the backward read it unchanged. Per chunk (the members of PrepTc, in order):
//   1. q, k, v, g rows to shared memory by cp.async (raw 16-bit values, zeros past T; g in the region T takes
//      later); Gamma = cumsum(g) (fp32).
//   2. Qg, Kg, Xw, Gamma to the workspace (elementwise).
//   3. A and M as 16x16 sub-chunk tiles, each one TF32 mma.sync product over K (spec §4.2): with n the first row of
//      the row sub-chunk, e^(G_i - G_j) = e^(G_i - G_n) e^(G_n - G_j), so the row operand is q or k times
//      e^(G_i - G_n) <= 1 and the column operand k_j e^(G_n - G_j): <= 1 on the off-diagonal tiles, and at most
//      e^(G_n - G_(n+15)) on the diagonal ones, which the lower-bounded gate keeps <= e^75 (fp32/TF32 overflow at
//      e^88.7). The anchor is the first row, so row i never sees later tokens: exactly causal. Each chunk checks the
//      bound itself (max over channels and sub-chunks of G_n - G_(n+15) <= kAnchorMaxNats = 76); a chunk past it (the
//      softplus gate) forms its diagonal tiles pairwise, every factor e^(G_i - G_j) <= 1, as the fp32 kernel does.
//   4. T = (I + L)^-1, L = Diag(beta) M, blockwise over 16x16 tiles (§4.4): the diagonal tiles by forward
//      substitution (fp32, CUDA cores), then T_ab = -T_aa sum_{b <= c < a} L_ac T_cb row block by row block
//      (3xTF32 tensor-core products, about fp32's accuracy).
//   5. W = T Xw and U = T Diag(beta) V on tensor cores, warps over 16-column slabs, T's zero tiles skipped.
// Every product accumulates in fp32; only operands round to TF32 (10 mantissa bits). Qg, Kg, W and A are stored
// rounded to TF32: their readers (the scans) use them only as MMA operands, which they would round anyway, and
// reading them as bits spares every warp the conversion (the fallback chunk kernel forms its exact Qg, Kg itself).
// Plain TF32 products (PrepTc::kSplit = false); the 3xTF32 variant, a precision check no test ran, was deleted.
// Warps own fixed tiles and sum in a fixed order: deterministic. The forward writes only what the scan reads (Qg, Kg,
// W, U, A, Gamma's last row), and M and T when the caller keeps them (ops::KdaSaved; Gamma's every row too when it
// keeps all); the backward also Gamma, Xw, M, T. With the tiles kept (kTilesIn, PrepMode::bwd_tiles) steps 3 and 4 are
// skipped: T is read back instead, bit for bit the T of the forward, so W and U come out identical; U is skipped when
// the states were kept too.
#include <string_view>

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace {

constexpr int kWarps = kThreads / 32;
constexpr int kSub = 16;  // sub-chunk (tile) rows
constexpr int kMaxSub = kMaxChunk / kSub;

// Shared memory layout (bytes). Row strides: Gamma ld_g = K + 4 floats and the 16-bit q/k/v tiles K + 8 / V + 8
// elements make every fragment read below conflict-free (or 2-way for Xw); the [c, c] fp32 tiles use c + 4.
// L reuses q's space (q is dead once A and M are formed).
struct Layout {
    int ldg, ldx, ldv, ldc;
    int g, q, k, v, t, x, beta, total;
};
__host__ __device__ inline Layout layout(const Dims& d) {
    Layout l{};
    l.ldg = d.k + 4;
    l.ldx = d.k + 8;
    l.ldv = d.v + 8;
    l.ldc = d.c + 4;
    const int qbytes = d.c * l.ldx * 2, lbytes = d.c * l.ldc * 4;
    l.g = 0;
    l.q = l.g + d.c * l.ldg * 4;
    l.k = l.q + (qbytes > lbytes ? qbytes : lbytes);
    l.v = l.k + qbytes;
    l.t = l.v + d.c * l.ldv * 2;
    // The T region first holds the raw g rows ([c, ldx] 16-bit), until Gamma is formed.
    l.x = l.t + (qbytes > lbytes ? qbytes : lbytes);
    l.beta = l.x + kSub * l.ldc * 4;
    l.total = l.beta + kMaxChunk * 4;
    return l;
}

// The A/M jobs of warp w (8 warps): row tile a and its jobs j0 .. j0 + n - 1 (job j: column tile j / 2, half j % 2;
// the jobs of row tile a are 2 (a + 1)). At c = 64 (4 row tiles, 20 jobs) tiles 3, 2, 1, 0 go to warps {0, 1, 2},
// {3, 4}, {5, 6}, {7}, three jobs or fewer each; at c = 32 (2 tiles, 6 jobs) one job per warp, warps 6 and 7 idle.
// Tables as nibbles, warp w at bits 4w.
struct AmJobs {
    int a, j0, n;
};
__device__ inline AmJobs am_jobs(int nsub, int warp) {
    const uint32_t a = nsub == 4 ? 0x01122333u : 0x00001111u, j0 = nsub == 4 ? 0x02030630u : 0x00103210u,
                   n = nsub == 4 ? 0x22233233u : 0x00111111u;
    auto nib = [&](uint32_t v) { return static_cast<int>((v >> (4 * warp)) & 0xFu); };
    return {nib(a), nib(j0), nib(n)};
}

// One block's (chunk, unit) of prep_tc_kernel: its indices, sizes and shared-memory tiles (layout). Each member
// function is one step of the header comment's list (kda.md §4.5 steps 1-5); the kernel calls them in order. Every
// member is inlined into the kernel, so the split into phases costs nothing at run time.
template <typename T, bool kTilesIn, bool kModel>
struct PrepTc {
    // Plain TF32 products (one MMA each): their rounding measured no change in any worst parity figure, so the
    // 3xTF32 variant, a precision check that no test ran, was deleted.
    static constexpr bool kSplit = false;
    const Dims d;
    const Layout l;
    unsigned char* const smem;
    float* const sg;   // Gamma [c, ldg]
    T* const sq;       // q [c, ldx]
    float* const sl;   // L [c, ldc], after A and M
    T* const sk;       // k [c, ldx]
    T* const sv;       // v [c, ldv]
    float* const stm;  // T [c, ldc]
    T* const sgr;      // raw g [c, ldx], before T
    float* const sx;   // [16, ldc] scratch of the inverse
    float* const sb;
    const int n, unit, b, hv, h;
    const int c, kd, vd, tid, t0, nsub;
    const int ldg, ldx, ldv, ldc;
    const int warp, lane, gq, tq;
    const int64_t cb, ck, cc;

    __device__ __forceinline__ PrepTc(unsigned char* sm, const Dims& dims)
        : d(model_dims<kModel>(dims)),
          l(layout(d)),
          smem(sm),
          sg(reinterpret_cast<float*>(smem + l.g)),
          sq(reinterpret_cast<T*>(smem + l.q)),
          sl(reinterpret_cast<float*>(smem + l.q)),
          sk(reinterpret_cast<T*>(smem + l.k)),
          sv(reinterpret_cast<T*>(smem + l.v)),
          stm(reinterpret_cast<float*>(smem + l.t)),
          sgr(reinterpret_cast<T*>(smem + l.t)),
          sx(reinterpret_cast<float*>(smem + l.x)),
          sb(reinterpret_cast<float*>(smem + l.beta)),
          n(blockIdx.x),
          unit(blockIdx.y),
          b(unit / d.hv),
          hv(unit % d.hv),
          h(hv / d.group),
          c(d.c),
          kd(d.k),
          vd(d.v),
          tid(threadIdx.x),
          t0(n * c),
          nsub(c / kSub),
          ldg(l.ldg),
          ldx(l.ldx),
          ldv(l.ldv),
          ldc(l.ldc),
          warp(tid / 32),
          lane(tid % 32),
          gq(lane / 4),
          tq(lane % 4),
          cb(chunk_index(d, unit, n)),
          ck(ck_off(d, cb)),
          cc(cc_off(d, cb)) {}

    // Step 1 (kda.md §4.5 step 1): the q, k, v, g rows to shared memory (a row past T reads row t0, mapped, and is
    // zero-filled), beta; waits for them.
    __device__ __forceinline__ void stage(const T* __restrict__ q,
                                          const T* __restrict__ k,
                                          const T* __restrict__ v,
                                          const T* __restrict__ g,
                                          const T* __restrict__ beta) const {
        for (int e = tid; e < c * (kd / 8); e += kThreads) {
            const int r = e / (kd / 8), x = (e % (kd / 8)) * 8;
            const bool ok = t0 + r < d.t;
            const int64_t src = qk_row(d, b, ok ? t0 + r : t0, h) + x;
            cp_async16_zfill(sq + r * ldx + x, q + src, ok);
            cp_async16_zfill(sk + r * ldx + x, k + src, ok);
            cp_async16_zfill(sgr + r * ldx + x, g + g_row(d, b, ok ? t0 + r : t0, hv) + x, ok);
        }
        for (int e = tid; e < c * (vd / 8); e += kThreads) {
            const int r = e / (vd / 8), y = (e % (vd / 8)) * 8;
            const bool ok = t0 + r < d.t;
            cp_async16_zfill(sv + r * ldv + y, v + v_row(d, b, ok ? t0 + r : t0, hv) + y, ok);
        }
        cp_async_commit();
        if (tid < c) sb[tid] = t0 + tid < d.t ? to_f32(beta[beta_at(d, b, t0 + tid, hv)]) : 0.0f;
        cp_async_wait<0>();
        __syncthreads();
    }

    // Step 1 (kda.md §4.5 step 2): Gamma = cumsum(g) from the staged g rows (g came in with q, k, v: one round trip
    // instead of four batches of sixteen global loads per channel, which took ~45% of the kernel's wall time), and
    // whether every diagonal tile is within the anchors' bound (§4.2; all threads get the answer).
    __device__ __forceinline__ bool gamma() const {
        bool diag_ok = true;
        for (int x = tid; x < kd; x += kThreads) {
            float acc = 0.0f;
            for (int s = 0; s < nsub; ++s) {
                float gv[kSub];
#pragma unroll
                for (int r = 0; r < kSub; ++r) gv[r] = to_f32(sgr[(s * kSub + r) * ldx + x]);  // zeros past T
                float first = 0.0f;
#pragma unroll
                for (int r = 0; r < kSub; ++r) {
                    acc += gv[r];
                    if (r == 0) first = acc;
                    sg[(s * kSub + r) * ldg + x] = acc;
                }
                if constexpr (!kTilesIn) {  // with T read back, no anchored tile is formed here
                    float mx = 0.0f;
#pragma unroll
                    for (int r = 0; r < kSub; ++r)
                        mx = fmaxf(mx,
                                   fmaxf(fabsf(to_f32(sq[(s * kSub + r) * ldx + x])),
                                         fabsf(to_f32(sk[(s * kSub + r) * ldx + x]))));
                    diag_ok = diag_ok && anchor_ok(first - acc, mx);
                }
            }
        }
        return __syncthreads_and(diag_ok) != 0;  // also the barrier after Gamma
    }

    // With T read back (kTilesIn): T from the forward (ops::KdaSaved), into its region now that the raw g rows there
    // are dead; the elementwise step runs while it arrives.
    __device__ __forceinline__ void stage_t(const Work& w) const {
        stage_async<kThreads>(stm, ldc, w.tm + cc, c, c, c);
        cp_async_commit();
    }

    // Step 2 (kda.md §4.1): the elementwise chunk quantities Qg, Kg, Xw and Gamma to the workspace, four channels
    // per thread.
    __device__ __forceinline__ void chunk_quantities(const Work& w, bool gam_all) const {
        for (int e = tid; e < c * kd / 4; e += kThreads) {
            const int r = (e * 4) / kd, x = (e * 4) % kd;
            const float4 gm = *reinterpret_cast<const float4*>(sg + r * ldg + x);
            const float4 gl = *reinterpret_cast<const float4*>(sg + (c - 1) * ldg + x);
            const float gs[4] = {gm.x, gm.y, gm.z, gm.w}, ls[4] = {gl.x, gl.y, gl.z, gl.w};
            float qg[4], kg[4], xw[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float ev = exp_ftz(gs[i]), kv = to_f32(sk[r * ldx + x + i]);
                qg[i] = tf32_bits(to_f32(sq[r * ldx + x + i]) * ev);
                kg[i] = tf32_bits(kv * exp_ftz(ls[i] - gs[i]));
                xw[i] = sb[r] * kv * ev;
            }
            const int64_t o = ck + static_cast<int64_t>(r) * kd + x;
            *reinterpret_cast<float4*>(w.qg + o) = make_float4(qg[0], qg[1], qg[2], qg[3]);
            *reinterpret_cast<float4*>(w.kg + o) = make_float4(kg[0], kg[1], kg[2], kg[3]);
            if (w.xw != nullptr) *reinterpret_cast<float4*>(w.xw + o) = make_float4(xw[0], xw[1], xw[2], xw[3]);
            if (gam_all || r == c - 1) *reinterpret_cast<float4*>(w.gam + o) = gm;
        }
    }

    // Step 3 (kda.md §4.5 step 3, §4.2): A and M as 16x16 tiles, then L = Diag(beta) M into shared memory (and the
    // zero tiles above the diagonal of A, M, L and T); the diagonal tiles pairwise when !diag_mma. A job is (row tile
    // a, column tile bt <= a, column half nh): 20 jobs at c = 64, 6 at 32. A warp takes up to three jobs of one row
    // tile (am_jobs), so the row operands q, k e^(G_i - G_n), the larger part of each k-step's work, are formed once
    // for all of them.
    __device__ __forceinline__ void a_m_tiles(
        const T* __restrict__ q, const T* __restrict__ k, const Work& w, bool diag_mma, PhaseClock pc) const {
        const AmJobs jobs = am_jobs(nsub, warp);
        const int i0 = jobs.a * kSub, r0 = i0 + gq, r1 = r0 + 8;
        float acc_a[3][4], acc_m[3][4];
        int job_j[3];
        bool job_on[3];
#pragma unroll
        for (int s = 0; s < 3; ++s) {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_a[s][i] = acc_m[s][i] = 0.0f;
            const int job = jobs.j0 + s, bt = job / 2, nh = job % 2;
            job_on[s] = s < jobs.n && (bt != jobs.a || diag_mma);
            job_j[s] = bt * kSub + nh * 8 + gq;
        }
        // The warp's jobs share each k-step: the row operands once, then up to three independent accumulator chains.
        for (int k0 = 0; k0 < kd && jobs.n > 0; k0 += 8) {
            const int x0 = k0 + tq, x1 = x0 + 4;
            const float an0 = sg[i0 * ldg + x0], an1 = sg[i0 * ldg + x1];
            const float f00 = exp_ftz(sg[r0 * ldg + x0] - an0), f10 = exp_ftz(sg[r1 * ldg + x0] - an0);
            const float f01 = exp_ftz(sg[r0 * ldg + x1] - an1), f11 = exp_ftz(sg[r1 * ldg + x1] - an1);
            uint32_t qh[4], ql[4], kh[4], kl[4];
            split_tf32<kSplit>(to_f32(sq[r0 * ldx + x0]) * f00, qh[0], ql[0]);
            split_tf32<kSplit>(to_f32(sq[r1 * ldx + x0]) * f10, qh[1], ql[1]);
            split_tf32<kSplit>(to_f32(sq[r0 * ldx + x1]) * f01, qh[2], ql[2]);
            split_tf32<kSplit>(to_f32(sq[r1 * ldx + x1]) * f11, qh[3], ql[3]);
            split_tf32<kSplit>(to_f32(sk[r0 * ldx + x0]) * f00, kh[0], kl[0]);
            split_tf32<kSplit>(to_f32(sk[r1 * ldx + x0]) * f10, kh[1], kl[1]);
            split_tf32<kSplit>(to_f32(sk[r0 * ldx + x1]) * f01, kh[2], kl[2]);
            split_tf32<kSplit>(to_f32(sk[r1 * ldx + x1]) * f11, kh[3], kl[3]);
#pragma unroll
            for (int s = 0; s < 3; ++s) {
                if (!job_on[s]) continue;
                const int j = job_j[s];
                uint32_t bh[2], bl[2];
                split_tf32<kSplit>(to_f32(sk[j * ldx + x0]) * exp_ftz(an0 - sg[j * ldg + x0]), bh[0], bl[0]);
                split_tf32<kSplit>(to_f32(sk[j * ldx + x1]) * exp_ftz(an1 - sg[j * ldg + x1]), bh[1], bl[1]);
                mma_tf32x3<kSplit>(acc_a[s], qh, ql, bh, bl);
                mma_tf32x3<kSplit>(acc_m[s], kh, kl, bh, bl);
            }
        }
        pc.mark(3);
        // Results: global A (and M) now, L = Diag(beta) M into shared memory once every warp is done with q.
        auto for_results = [&](auto&& fn) {
#pragma unroll
            for (int s = 0; s < 3; ++s) {
                if (!job_on[s]) continue;
                const int job = jobs.j0 + s, bt = job / 2, nh = job % 2;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = i0 + gq + (e / 2) * 8, jj = bt * kSub + nh * 8 + 2 * tq + (e % 2);
                    fn(i, jj, i >= jj ? acc_a[s][e] : 0.0f, i > jj ? acc_m[s][e] : 0.0f);
                }
            }
        };
        for_results([&](int i, int jj, float av, float mv) {
            w.a[cc + i * c + jj] = tf32_bits(av);
            if (w.m != nullptr) w.m[cc + i * c + jj] = mv;
        });
        __syncthreads();
        pc.mark(4);
        for_results([&](int i, int jj, float, float mv) { sl[i * ldc + jj] = sb[i] * mv; });
        for (int e = tid; e < c * c; e += kThreads) {  // the zero tiles above the diagonal, of L and of T
            const int i = e / c, jj = e % c;
            if (jj / kSub <= i / kSub) continue;
            w.a[cc + e] = 0.0f;
            if (w.m != nullptr) w.m[cc + e] = 0.0f;
            sl[i * ldc + jj] = 0.0f;
            stm[i * ldc + jj] = 0.0f;
        }
        if (!diag_mma) {
            // Diagonal tiles pairwise (every factor <= 1): one warp per entry, the lanes over K; q, k from global
            // memory (q's shared copy is now L).
            for (int e = warp; e < nsub * kSub * kSub; e += kWarps) {
                const int s = e / (kSub * kSub), i = s * kSub + (e / kSub) % kSub, jj = s * kSub + e % kSub;
                float sa = 0.0f, sm = 0.0f;
                if (jj <= i && t0 + i < d.t) {
                    const int64_t qi = qk_row(d, b, t0 + i, h), kj = qk_row(d, b, t0 + jj, h);
                    for (int x = lane; x < kd; x += 32) {
                        const float kjx = to_f32(k[kj + x]) * expf(sg[i * ldg + x] - sg[jj * ldg + x]);
                        sa += to_f32(q[qi + x]) * kjx;
                        sm += to_f32(k[qi + x]) * kjx;
                    }
                    sa = warp_sum(sa);
                    sm = warp_sum(sm);
                }
                if (jj >= i) sm = 0.0f;
                if (lane == 0) {
                    w.a[cc + i * c + jj] = tf32_bits(sa);
                    if (w.m != nullptr) w.m[cc + i * c + jj] = sm;
                    sl[i * ldc + jj] = sb[i] * sm;
                }
            }
        }
    }

    // Step 4 (kda.md §4.4): T = (I + L)^-1, the diagonal tiles: column j of tile a by forward substitution.
    __device__ __forceinline__ void diag_inverse() const {
        if (tid < c) {
            const int j = tid, base = (j / kSub) * kSub;
            for (int i = base; i < j; ++i) stm[i * ldc + j] = 0.0f;
            stm[j * ldc + j] = 1.0f;
            for (int i = j + 1; i < base + kSub; ++i) {
                float acc = 0.0f;
                for (int x = j; x < i; ++x) acc += sl[i * ldc + x] * stm[x * ldc + j];
                stm[i * ldc + j] = -acc;
            }
        }
    }

    // Step 4 (kda.md §4.4): the off-diagonal row blocks in order: X = L_a,<a T_<a,<a (T_xj = 0 for x < j), then
    // T_a,<a = -T_aa X, on tensor cores as 3xTF32 (about fp32's accuracy, like the CUDA-core loops they replace,
    // which took ~20% of the kernel in serial multiply-add chains): a warp per 8 columns.
    __device__ __forceinline__ void offdiag_inverse() const {
        for (int a = 1; a < nsub; ++a) {
            const int wd = a * kSub;
            for (int n0 = warp * 8; n0 < wd; n0 += kWarps * 8) {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int k0 = n0; k0 < wd; k0 += 8) {
                    float fa[4], fb[2];
                    frag_a_f(fa, sl, ldc, wd, k0, gq, tq);
                    frag_b_f(fb, stm, ldc, k0, n0, gq, tq);
                    mma_f32<true>(acc, fa, fb);
                }
                *reinterpret_cast<float2*>(sx + gq * ldc + n0 + 2 * tq) = make_float2(acc[0], acc[1]);
                *reinterpret_cast<float2*>(sx + (gq + 8) * ldc + n0 + 2 * tq) = make_float2(acc[2], acc[3]);
            }
            __syncthreads();
            for (int n0 = warp * 8; n0 < wd; n0 += kWarps * 8) {
                float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int k0 = 0; k0 < kSub; k0 += 8) {
                    float fa[4], fb[2];
                    frag_a_f(fa, stm + wd, ldc, wd, k0, gq, tq);  // T_aa
                    frag_b_f(fb, sx, ldc, k0, n0, gq, tq);
                    mma_f32<true>(acc, fa, fb);
                }
                float* dst = stm + wd * ldc + n0 + 2 * tq;
                *reinterpret_cast<float2*>(dst + gq * ldc) = make_float2(-acc[0], -acc[1]);
                *reinterpret_cast<float2*>(dst + (gq + 8) * ldc) = make_float2(-acc[2], -acc[3]);
            }
            __syncthreads();
        }
    }

    // T kept for the backward (w.tm, exact), and from here on only step 5's A operand: with plain TF32 products it
    // is rounded once here, in shared memory, instead of at every fragment of every warp.
    __device__ __forceinline__ void keep_t(const Work& w) const {
        for (int e = tid; e < c * c; e += kThreads) {
            const int i = (e / c) * ldc + e % c;
            const float x = stm[i];
            if (!kTilesIn && w.tm != nullptr) w.tm[cc + e] = x;
            stm[i] = tf32_bits(x);
        }
        __syncthreads();
    }

    // Step 5 (kda.md §4.5 step 5): W = T Xw (Xw = Diag(beta) K e^Gamma formed in the fragment loads) and
    // U = T Diag(beta) V: a warp per 16-column slab, k (token) steps outer so each B fragment is formed once, row
    // tiles a >= the k step's tile.
    __device__ __forceinline__ void w_u(const Work& w) const {
        const int wslabs = kd / kSub, nslab = wslabs + (w.u != nullptr ? vd / kSub : 0);
        for (int job = warp; job < nslab; job += kWarps) {
            const bool isw = job < wslabs;
            const int n0 = (isw ? job : job - wslabs) * kSub;
            float acc[kMaxSub][2][4];
#pragma unroll
            for (int a = 0; a < kMaxSub; ++a)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[a][nt][i] = 0.0f;
            for (int k0 = 0; k0 < c; k0 += 8) {
                uint32_t bh[2][2], bl[2][2];
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    const int col = n0 + nt * 8 + gq;
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf) {
                        const int jr = k0 + tq + 4 * hf;
                        const float val = isw ? sb[jr] * to_f32(sk[jr * ldx + col]) * exp_ftz(sg[jr * ldg + col])
                                              : sb[jr] * to_f32(sv[jr * ldv + col]);
                        split_tf32<kSplit>(val, bh[nt][hf], bl[nt][hf]);
                    }
                }
                const int kb = k0 / kSub;
#pragma unroll
                for (int a = 0; a < kMaxSub; ++a) {
                    if (a < kb || a >= nsub) continue;
                    uint32_t ah[4], al[4];
                    const int m0 = a * kSub;
                    float fa[4];
                    frag_a_f(fa, stm, ldc, m0, k0, gq, tq);
#pragma unroll
                    for (int e = 0; e < 4; ++e) ah[e] = __float_as_uint(fa[e]);  // rounded in keep_t
                    mma_tf32x3<kSplit>(acc[a][0], ah, al, bh[0], bl[0]);
                    mma_tf32x3<kSplit>(acc[a][1], ah, al, bh[1], bl[1]);
                }
            }
            float* dst = isw ? w.w + ck : w.u + cv_off(d, cb);
            const int ld = isw ? kd : vd;
#pragma unroll
            for (int a = 0; a < kMaxSub; ++a) {
                if (a >= nsub) continue;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    if (isw)  // W is only ever an MMA operand (the scans): stored rounded; U is an addend, kept exact
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[a][nt][e] = tf32_bits(acc[a][nt][e]);
                    const int r0 = a * kSub + gq, col = n0 + nt * 8 + 2 * tq;
                    *reinterpret_cast<float2*>(dst + r0 * ld + col) = make_float2(acc[a][nt][0], acc[a][nt][1]);
                    *reinterpret_cast<float2*>(dst + (r0 + 8) * ld + col) = make_float2(acc[a][nt][2], acc[a][nt][3]);
                }
            }
        }
    }
};

template <typename T, bool kTilesIn, bool kModel>
__global__ void __launch_bounds__(kThreads, 2) prep_tc_kernel(const T* __restrict__ q,
                                                              const T* __restrict__ k,
                                                              const T* __restrict__ v,
                                                              const T* __restrict__ g,
                                                              const T* __restrict__ beta,
                                                              Dims dims,
                                                              Work w,
                                                              bool gam_all,
                                                              PhaseClock pc) {
    extern __shared__ __align__(16) unsigned char smem[];
    const PrepTc<T, kTilesIn, kModel> s(smem, dims);
    pc.mark(0);
    s.stage(q, k, v, g, beta);
    const bool diag_mma = s.gamma();
    if constexpr (kTilesIn) s.stage_t(w);
    pc.mark(1);
    s.chunk_quantities(w, gam_all);
    pc.mark(2);
    if constexpr (kTilesIn) {
        cp_async_wait<0>();
        __syncthreads();
        pc.mark(3);  // the wait for T; phases 4-6 (A, M, L, T's diagonal) do not run
        pc.mark(4);
        pc.mark(5);
        pc.mark(6);
    } else {
        s.a_m_tiles(q, k, w, diag_mma, pc);
        __syncthreads();
        pc.mark(5);
        s.diag_inverse();
        __syncthreads();
        pc.mark(6);
        s.offdiag_inverse();
    }  // kTilesIn
    pc.mark(7);
    s.keep_t(w);
    s.w_u(w);
    pc.mark(8);
}

template <typename T>
void launch(const Tensor& q,
            const Tensor& k,
            const Tensor& v,
            const Tensor& g,
            const Tensor& beta,
            const Dims& d,
            const Work& w,
            PrepMode mode) {
    const dim3 grid(static_cast<unsigned>(d.nc), static_cast<unsigned>(d.units()));
    const auto smem = static_cast<size_t>(layout(d).total);
    const bool tiles_in = mode == PrepMode::bwd_tiles;
    const char* name = mode == PrepMode::bwd ? "prep_full" : (tiles_in ? "prep_tiles" : "prep");
    const PhaseLog phases(name, static_cast<int64_t>(d.nc) * d.units());
    with_model_shape(d, [&](auto model) {
        constexpr bool kModel = decltype(model)::value;
        auto kernel = tiles_in ? prep_tc_kernel<T, true, kModel> : prep_tc_kernel<T, false, kModel>;
        MT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        kernel<<<grid, kThreads, smem, core::exec_stream()>>>(static_cast<const T*>(q.raw()),
                                                              static_cast<const T*>(k.raw()),
                                                              static_cast<const T*>(v.raw()),
                                                              static_cast<const T*>(g.raw()),
                                                              static_cast<const T*>(beta.raw()),
                                                              d,
                                                              w,
                                                              mode != PrepMode::fwd,  // every row of Gamma
                                                              phases.clock());
    });
    MT_CUDA_CHECK(cudaGetLastError());
    phases.print(9);
}

}  // namespace

void prep_tc_launch(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const Dims& d,
                    const Work& w,
                    PrepMode mode) {
    if (q.dtype() == DType::bf16)
        launch<bf16>(q, k, v, g, beta, d, w, mode);
    else
        launch<f16>(q, k, v, g, beta, d, w, mode);
}

}  // namespace mt::ops::cuda::kda
