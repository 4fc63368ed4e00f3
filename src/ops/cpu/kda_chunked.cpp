// CPU reference of KDA's chunked algorithm (kda.md §4), with the tiles and anchors of the CUDA design: chunks of
// C tokens, sub-chunks of 16. Per chunk, with Gamma the in-chunk cumulative log decay:
//   A_ij = sum_d q_id k_jd e^(Gamma_id - Gamma_jd) (i >= j),  M_ij = same with k_i (i > j),  L = Diag(beta) M
//   T = (I + L)^-1,  W = T Diag(beta) (K * e^Gamma),  U = T Diag(beta) V
//   Vn = U - W S,  O = (Q * e^Gamma) S + A Vn,  S <- Diag(gamma) S + (K * e^(Gamma_C - Gamma))^T Vn
// With C = 1, A = q.k e^0, L = 0, T = 1, W = beta k * alpha, U = beta v: Vn = beta (v - k^T Diag(alpha) S) and
// S <- Diag(alpha) S + k Vn, O = q^T S: exactly the step of kda.md §2.
// Block row a of A and M (rows of sub-chunk a) is one product with anchor n = the sub-chunk's first row:
// row factors e^(Gamma_i - Gamma_n) <= 1, column factors e^(Gamma_n - Gamma_j), <= 1 left of the diagonal tile and
// up to e^(15 |g|) inside it (the matmul diagonal); the pairwise diagonal forms each entry from factors <= 1.
// The anchor cancels in exact arithmetic, so the backward treats it as a constant. OpenMP runs one task per
// (batch, value head) forward and per (batch, q/k head) backward (its value heads in order: fixed dq/dk sums).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/kda.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"

namespace mt::ops::cpu {

namespace {

constexpr int64_t kSub = 16;

// y[x] = e^(a[x] - b[x]) for x < n (y distinct from a and b), through the vectorized exp
// of vec_math.h for f32 (libm's scalar expf was an eighth of a small hybrid model's CPU step) and std::exp for f64.
template <typename T>
void exp_diff(const T* a, const T* b, T* y, int64_t n) {
    for (int64_t x = 0; x < n; ++x) y[x] = a[x] - b[x];
    exp_affine(y, y, n, T(1), T(0));
}

// The quantities of one chunk of one value head (c rows, key dim kd, value dim vd), row-major with row length kd,
// vd or c. Buffers are sized for the full chunk and reused.
template <typename T>
struct Chunk {
    int64_t c = 0, kd = 0, vd = 0;
    std::vector<T> q, k, v, beta, gam, e, qg, xw, xu, kg, gamma, a, m, tm, w, u;
    std::vector<T> qa, kr, kc;  // scratch of the tile products: [16, kd], [16, kd], [C, kd]
    // The decay factors, kept for the backward of the same chunk: fr = e^(Gamma_i - Gamma_n) [16, kd] and
    // fc = e^(Gamma_n - Gamma_j) [C, kd] of the last anchored_factors, fk = e^(Gamma_last - Gamma) [C, kd] of
    // prepare_chunk; f one row [kd] (the pairwise diagonal).
    std::vector<T> fr, fc, fk, f;

    Chunk(int64_t cmax, int64_t kd_, int64_t vd_) : kd(kd_), vd(vd_) {
        const auto ck = static_cast<size_t>(cmax * kd), cv = static_cast<size_t>(cmax * vd);
        const auto cc = static_cast<size_t>(cmax * cmax);
        for (auto* x : {&q, &k, &gam, &e, &qg, &xw, &kg, &w, &kc, &fc, &fk}) x->resize(ck);
        for (auto* x : {&v, &xu, &u}) x->resize(cv);
        for (auto* x : {&a, &m, &tm}) x->resize(cc);
        beta.resize(static_cast<size_t>(cmax));
        gamma.resize(static_cast<size_t>(kd));
        qa.resize(static_cast<size_t>(kSub * kd));
        kr.resize(static_cast<size_t>(kSub * kd));
        fr.resize(static_cast<size_t>(kSub * kd));
        f.resize(static_cast<size_t>(kd));
    }
};

// Where one (batch, value head) lives: token t's q/k row at q + t * qs (h already applied), and so on.
template <typename T>
struct UnitPtrs {
    const T *q, *k, *v, *g, *beta;
    int64_t qs, vs, gs, bs;
};

template <typename T>
UnitPtrs<T> unit_ptrs(
    const T* q, const T* k, const T* v, const T* g, const T* beta, const KdaDims& d, int64_t bb, int64_t hv) {
    const int64_t h = hv / (d.hv / d.h), row0 = bb * d.t;
    return {q + row0 * d.h * d.k + h * d.k,
            k + row0 * d.h * d.k + h * d.k,
            v + row0 * d.hv * d.v + hv * d.v,
            g + row0 * d.hv * d.k + hv * d.k,
            beta + row0 * d.hv + hv,
            d.h * d.k,
            d.hv * d.v,
            d.hv * d.k,
            d.hv};
}

template <typename T>
void load_rows(const T* src, int64_t stride, int64_t rows, int64_t cols, T* dst) {
    for (int64_t r = 0; r < rows; ++r) std::copy(src + r * stride, src + r * stride + cols, dst + r * cols);
}

// The anchored factors of block row [r0, r1) (anchor n = r0) against columns [0, cols):
//   qa_i = q_i e^(Gamma_i - Gamma_n),  kr_i = k_i e^(Gamma_i - Gamma_n),  kc_j = k_j e^(Gamma_n - Gamma_j).
template <typename T>
void anchored_factors(Chunk<T>& ch, int64_t r0, int64_t r1, int64_t cols) {
    const int64_t kd = ch.kd;
    const T* gn = ch.gam.data() + r0 * kd;
    for (int64_t i = r0; i < r1; ++i) {
        const int64_t li = (i - r0) * kd;
        T* fr = ch.fr.data() + li;
        exp_diff(ch.gam.data() + i * kd, gn, fr, kd);
        for (int64_t x = 0; x < kd; ++x) {
            ch.qa[li + x] = ch.q[i * kd + x] * fr[x];
            ch.kr[li + x] = ch.k[i * kd + x] * fr[x];
        }
    }
    for (int64_t j = 0; j < cols; ++j) {
        T* fc = ch.fc.data() + j * kd;
        exp_diff(gn, ch.gam.data() + j * kd, fc, kd);
        for (int64_t x = 0; x < kd; ++x) ch.kc[j * kd + x] = ch.k[j * kd + x] * fc[x];
    }
}

// A (i >= j) and M (i > j) of the chunk, tile row by tile row; zero elsewhere.
template <typename T>
void intra_fwd(Chunk<T>& ch, bool pairwise) {
    const int64_t c = ch.c, kd = ch.kd;
    std::fill(ch.a.begin(), ch.a.begin() + c * c, T(0));
    std::fill(ch.m.begin(), ch.m.begin() + c * c, T(0));
    for (int64_t r0 = 0; r0 < c; r0 += kSub) {
        const int64_t r1 = std::min(r0 + kSub, c), rows = r1 - r0, cols = pairwise ? r0 : r1;
        anchored_factors(ch, r0, r1, cols);
        gemm(false, true, rows, cols, kd, T(1), ch.qa.data(), kd, ch.kc.data(), kd, T(0), &ch.a[r0 * c], c);
        gemm(false, true, rows, cols, kd, T(1), ch.kr.data(), kd, ch.kc.data(), kd, T(0), &ch.m[r0 * c], c);
        for (int64_t i = r0; i < r1; ++i) {
            for (int64_t j = r0; j < r1; ++j) {
                if (pairwise && j <= i) {
                    T sa = 0, sm = 0;
                    exp_diff(ch.gam.data() + i * kd, ch.gam.data() + j * kd, ch.f.data(), kd);
                    for (int64_t x = 0; x < kd; ++x) {
                        const T f = ch.f[x];
                        sa += ch.q[i * kd + x] * ch.k[j * kd + x] * f;
                        sm += ch.k[i * kd + x] * ch.k[j * kd + x] * f;
                    }
                    ch.a[i * c + j] = sa;
                    ch.m[i * c + j] = j < i ? sm : T(0);
                }
                if (j > i) ch.a[i * c + j] = T(0);
                if (j >= i) ch.m[i * c + j] = T(0);
            }
        }
    }
}

// T = (I + L)^-1, L = Diag(beta) M strictly lower (kda.md §4.4): the diagonal 16 x 16 blocks by forward
// substitution, then T_ab = -T_aa sum_{b <= c < a} L_ac T_cb for the blocks below them.
template <typename T>
void invert_unit_lower(Chunk<T>& ch) {
    const int64_t c = ch.c;
    T* tm = ch.tm.data();
    auto l = [&](int64_t i, int64_t j) { return ch.beta[i] * ch.m[i * c + j]; };
    std::fill(tm, tm + c * c, T(0));
    for (int64_t r0 = 0; r0 < c; r0 += kSub) {
        const int64_t r1 = std::min(r0 + kSub, c);
        for (int64_t i = r0; i < r1; ++i) {
            tm[i * c + i] = 1;
            for (int64_t j = r0; j < i; ++j) {
                T acc = 0;
                for (int64_t x = j; x < i; ++x) acc += l(i, x) * tm[x * c + j];
                tm[i * c + j] = -acc;
            }
        }
    }
    std::vector<T> xb(static_cast<size_t>(kSub * kSub));
    for (int64_t a0 = kSub; a0 < c; a0 += kSub) {
        const int64_t a1 = std::min(a0 + kSub, c);
        for (int64_t b0 = 0; b0 < a0; b0 += kSub) {
            const int64_t b1 = b0 + kSub;
            for (int64_t i = a0; i < a1; ++i) {  // X = sum_{b <= c < a} L_ac T_cb
                for (int64_t j = b0; j < b1; ++j) {
                    T acc = 0;
                    for (int64_t x = j; x < a0; ++x) acc += l(i, x) * tm[x * c + j];
                    xb[(i - a0) * kSub + (j - b0)] = acc;
                }
            }
            for (int64_t i = a0; i < a1; ++i) {  // T_ab = -T_aa X
                for (int64_t j = b0; j < b1; ++j) {
                    T acc = 0;
                    for (int64_t x = a0; x <= i; ++x) acc += tm[i * c + x] * xb[(x - a0) * kSub + (j - b0)];
                    tm[i * c + j] = -acc;
                }
            }
        }
    }
}

// Loads chunk [c0, c0 + c) of a unit and forms Gamma, the decay-weighted rows, A, M, T, W and U.
template <typename T>
void prepare_chunk(Chunk<T>& ch, const UnitPtrs<T>& u, int64_t c0, int64_t c, bool pairwise) {
    ch.c = c;
    const int64_t kd = ch.kd, vd = ch.vd;
    load_rows(u.q + c0 * u.qs, u.qs, c, kd, ch.q.data());
    load_rows(u.k + c0 * u.qs, u.qs, c, kd, ch.k.data());
    load_rows(u.v + c0 * u.vs, u.vs, c, vd, ch.v.data());
    for (int64_t r = 0; r < c; ++r) {
        ch.beta[r] = u.beta[(c0 + r) * u.bs];
        const T* gr = u.g + (c0 + r) * u.gs;
        for (int64_t x = 0; x < kd; ++x) ch.gam[r * kd + x] = (r ? ch.gam[(r - 1) * kd + x] : T(0)) + gr[x];
    }
    const T* glast = ch.gam.data() + (c - 1) * kd;
    exp_affine(glast, ch.gamma.data(), kd, T(1), T(0));
    exp_affine(ch.gam.data(), ch.e.data(), c * kd, T(1), T(0));
    for (int64_t r = 0; r < c; ++r) {
        exp_diff(glast, ch.gam.data() + r * kd, ch.fk.data() + r * kd, kd);
        for (int64_t x = 0; x < kd; ++x) {
            const int64_t i = r * kd + x;
            ch.qg[i] = ch.q[i] * ch.e[i];
            ch.xw[i] = ch.beta[r] * ch.k[i] * ch.e[i];
            ch.kg[i] = ch.k[i] * ch.fk[i];
        }
        for (int64_t y = 0; y < vd; ++y) ch.xu[r * vd + y] = ch.beta[r] * ch.v[r * vd + y];
    }
    intra_fwd(ch, pairwise);
    invert_unit_lower(ch);
    gemm(false, false, c, kd, c, T(1), ch.tm.data(), c, ch.xw.data(), kd, T(0), ch.w.data(), kd);
    gemm(false, false, c, vd, c, T(1), ch.tm.data(), c, ch.xu.data(), vd, T(0), ch.u.data(), vd);
}

// vn = U - W S [c, vd]
template <typename T>
void new_values(const Chunk<T>& ch, const T* s, T* vn) {
    std::copy(ch.u.begin(), ch.u.begin() + ch.c * ch.vd, vn);
    gemm(false, false, ch.c, ch.vd, ch.kd, T(-1), ch.w.data(), ch.kd, s, ch.vd, T(1), vn, ch.vd);
}

// S <- Diag(gamma) S + Kg^T vn
template <typename T>
void advance_state(const Chunk<T>& ch, const T* vn, T* s) {
    for (int64_t x = 0; x < ch.kd; ++x)
        for (int64_t y = 0; y < ch.vd; ++y) s[x * ch.vd + y] *= ch.gamma[x];
    gemm(true, false, ch.kd, ch.vd, ch.c, T(1), ch.kg.data(), ch.kd, vn, ch.vd, T(1), s, ch.vd);
}

// Gradients of A (da, i >= j) and M (dm, i > j) into dq, dk and dgam [c, kd] (all +=), through the same tiles.
template <typename T>
void intra_bwd(Chunk<T>& ch, const T* da, const T* dm, T* dq, T* dk, T* dgam, bool pairwise) {
    const int64_t c = ch.c, kd = ch.kd;
    std::vector<T> dqa(static_cast<size_t>(kSub * kd)), dkr(static_cast<size_t>(kSub * kd));
    std::vector<T> dkc(static_cast<size_t>(c * kd));
    for (int64_t r0 = 0; r0 < c; r0 += kSub) {
        const int64_t r1 = std::min(r0 + kSub, c), rows = r1 - r0, cols = pairwise ? r0 : r1;
        anchored_factors(ch, r0, r1, cols);
        const T *dar = da + r0 * c, *dmr = dm + r0 * c;
        gemm(false, false, rows, kd, cols, T(1), dar, c, ch.kc.data(), kd, T(0), dqa.data(), kd);
        gemm(false, false, rows, kd, cols, T(1), dmr, c, ch.kc.data(), kd, T(0), dkr.data(), kd);
        gemm(true, false, cols, kd, rows, T(1), dar, c, ch.qa.data(), kd, T(0), dkc.data(), kd);
        gemm(true, false, cols, kd, rows, T(1), dmr, c, ch.kr.data(), kd, T(1), dkc.data(), kd);
        // The factors anchored_factors just formed for this block row (ch.fr, ch.fc).
        for (int64_t i = r0; i < r1; ++i) {
            for (int64_t x = 0; x < kd; ++x) {
                const int64_t li = (i - r0) * kd + x, ci = i * kd + x;
                dq[ci] += dqa[li] * ch.fr[li];
                dk[ci] += dkr[li] * ch.fr[li];
                dgam[ci] += dqa[li] * ch.qa[li] + dkr[li] * ch.kr[li];
            }
        }
        for (int64_t j = 0; j < cols; ++j) {
            for (int64_t x = 0; x < kd; ++x) {
                const int64_t ci = j * kd + x;
                dk[ci] += dkc[ci] * ch.fc[ci];
                dgam[ci] -= dkc[ci] * ch.kc[ci];
            }
        }
        if (!pairwise) continue;
        T* f = ch.f.data();
        for (int64_t i = r0; i < r1; ++i) {
            for (int64_t j = r0; j <= i; ++j) {
                const T ga = da[i * c + j], gm = j < i ? dm[i * c + j] : T(0);
                exp_diff(ch.gam.data() + i * kd, ch.gam.data() + j * kd, f, kd);
                for (int64_t x = 0; x < kd; ++x) {
                    const int64_t ii = i * kd + x, jj = j * kd + x;
                    const T ta = ga * f[x], tmk = gm * f[x];
                    dq[ii] += ta * ch.k[jj];
                    dk[jj] += ta * ch.q[ii] + tmk * ch.k[ii];
                    dk[ii] += tmk * ch.k[jj];
                    const T dgm = ta * ch.q[ii] * ch.k[jj] + tmk * ch.k[ii] * ch.k[jj];
                    dgam[ii] += dgm;
                    dgam[jj] -= dgm;
                }
            }
        }
    }
}

// Whether the state entering chunk n of row bb restarts from zero (ops::KdaOptions::chunk_reset, [B, nchunks]).
bool resets(const int32_t* reset, int64_t bb, int64_t nchunks, int64_t n) {
    return reset != nullptr && reset[bb * nchunks + n] != 0;
}

// Per-thread buffers of the backward of one chunk.
template <typename T>
struct ChunkGrads {
    std::vector<T> vn, dvn, da, dm, dt, tmp, dw, dxw, dxu, dqg, dkg, dq, dk, dgam, dbeta;
    ChunkGrads(int64_t cmax, int64_t kd, int64_t vd) {
        const auto ck = static_cast<size_t>(cmax * kd), cv = static_cast<size_t>(cmax * vd);
        const auto cc = static_cast<size_t>(cmax * cmax);
        for (auto* x : {&dw, &dxw, &dqg, &dkg, &dq, &dk, &dgam}) x->resize(ck);
        for (auto* x : {&vn, &dvn, &dxu}) x->resize(cv);
        for (auto* x : {&da, &dm, &dt, &tmp}) x->resize(cc);
        dbeta.resize(static_cast<size_t>(cmax));
    }
};

// Backward of one prepared chunk (kda.md §4.6) given its entering state h, dO [c, vd] and ds, the gradient of the
// state leaving the chunk; ds becomes the gradient of h. Leaves dq, dk, dgam (then dg), dbeta in gr and dv in
// gr.dxu (scaled).
template <typename T>
void chunk_bwd(Chunk<T>& ch, ChunkGrads<T>& gr, const T* h, const T* dout, T* ds, T* dh, bool pairwise) {
    const int64_t c = ch.c, kd = ch.kd, vd = ch.vd;
    T* vn = gr.vn.data();
    T* dvn = gr.dvn.data();
    new_values(ch, h, vn);
    // dVn = A^T dO + Kg dS;  dA = tril(dO Vn^T);  dQg = dO h^T;  dKg = Vn dS^T
    gemm(true, false, c, vd, c, T(1), ch.a.data(), c, dout, vd, T(0), dvn, vd);
    gemm(false, false, c, vd, kd, T(1), ch.kg.data(), kd, ds, vd, T(1), dvn, vd);
    gemm(false, true, c, c, vd, T(1), dout, vd, vn, vd, T(0), gr.da.data(), c);
    for (int64_t i = 0; i < c; ++i)
        for (int64_t j = i + 1; j < c; ++j) gr.da[i * c + j] = 0;
    gemm(false, true, c, kd, vd, T(1), dout, vd, h, vd, T(0), gr.dqg.data(), kd);
    gemm(false, true, c, kd, vd, T(1), vn, vd, ds, vd, T(0), gr.dkg.data(), kd);
    // dh = Qg^T dO + Diag(gamma) dS - W^T dVn, and dGamma_last += gamma * rowsum(h * dS)
    std::vector<T> dglast(static_cast<size_t>(kd), T(0));
    for (int64_t x = 0; x < kd; ++x) {
        T acc = 0;
        for (int64_t y = 0; y < vd; ++y) {
            acc += h[x * vd + y] * ds[x * vd + y];
            dh[x * vd + y] = ch.gamma[x] * ds[x * vd + y];
        }
        dglast[x] = ch.gamma[x] * acc;
    }
    gemm(true, false, kd, vd, c, T(1), ch.qg.data(), kd, dout, vd, T(1), dh, vd);
    gemm(true, false, kd, vd, c, T(-1), ch.w.data(), kd, dvn, vd, T(1), dh, vd);
    // dW = -dVn h^T;  dXw = T^T dW;  dXu = T^T dVn;  dT = dW Xw^T + dVn Xu^T;  dL = -strict_tril(T^T dT T^T)
    gemm(false, true, c, kd, vd, T(-1), dvn, vd, h, vd, T(0), gr.dw.data(), kd);
    gemm(true, false, c, kd, c, T(1), ch.tm.data(), c, gr.dw.data(), kd, T(0), gr.dxw.data(), kd);
    gemm(true, false, c, vd, c, T(1), ch.tm.data(), c, dvn, vd, T(0), gr.dxu.data(), vd);
    gemm(false, true, c, c, kd, T(1), gr.dw.data(), kd, ch.xw.data(), kd, T(0), gr.dt.data(), c);
    gemm(false, true, c, c, vd, T(1), dvn, vd, ch.xu.data(), vd, T(1), gr.dt.data(), c);
    gemm(true, false, c, c, c, T(1), ch.tm.data(), c, gr.dt.data(), c, T(0), gr.tmp.data(), c);
    gemm(false, true, c, c, c, T(-1), gr.tmp.data(), c, ch.tm.data(), c, T(0), gr.dm.data(), c);
    // L = Diag(beta) M: dbeta_i = sum_j dL_ij M_ij, dM = Diag(beta) dL (strictly lower)
    for (int64_t i = 0; i < c; ++i) {
        T acc = 0;
        for (int64_t j = 0; j < c; ++j) {
            T& dmij = gr.dm[i * c + j];
            if (j >= i) {
                dmij = 0;
                continue;
            }
            acc += dmij * ch.m[i * c + j];
            dmij *= ch.beta[i];
        }
        gr.dbeta[i] = acc;
    }
    // Elementwise factors: Qg = Q e^Gamma, Kg = K e^(Gamma_last - Gamma), Xw = beta K e^Gamma, Xu = beta V.
    for (int64_t r = 0; r < c; ++r) {
        T db = 0;
        for (int64_t x = 0; x < kd; ++x) {
            const int64_t i = r * kd + x;
            const T fk = ch.fk[i];  // prepare_chunk's e^(Gamma_last - Gamma) of this chunk
            gr.dq[i] = gr.dqg[i] * ch.e[i];
            gr.dk[i] = gr.dkg[i] * fk + ch.beta[r] * gr.dxw[i] * ch.e[i];
            gr.dgam[i] = gr.dqg[i] * ch.qg[i] - gr.dkg[i] * ch.kg[i] + gr.dxw[i] * ch.xw[i];
            dglast[x] += gr.dkg[i] * ch.kg[i];
            db += gr.dxw[i] * ch.k[i] * ch.e[i];
        }
        for (int64_t y = 0; y < vd; ++y) {
            db += gr.dxu[r * vd + y] * ch.v[r * vd + y];
            gr.dxu[r * vd + y] *= ch.beta[r];  // now dv
        }
        gr.dbeta[r] += db;
    }
    for (int64_t x = 0; x < kd; ++x) gr.dgam[(c - 1) * kd + x] += dglast[x];
    intra_bwd(ch, gr.da.data(), gr.dm.data(), gr.dq.data(), gr.dk.data(), gr.dgam.data(), pairwise);
    for (int64_t r = c - 2; r >= 0; --r)  // dg = reverse cumsum of dGamma within the chunk
        for (int64_t x = 0; x < kd; ++x) gr.dgam[r * kd + x] += gr.dgam[(r + 1) * kd + x];
}

}  // namespace

template <typename T>
void kda_chunked_fwd(const T* q,
                     const T* k,
                     const T* v,
                     const T* g,
                     const T* beta,
                     const T* s0,
                     T* out,
                     T* st,
                     const KdaDims& d,
                     int64_t chunk,
                     bool pairwise,
                     const int32_t* reset) {
    blas_use_one_thread();
    const int64_t kv = d.k * d.v, nchunks = (d.t + chunk - 1) / chunk;
#pragma omp parallel if (d.b * d.hv * d.t * kv >= kParallelMinWork)
    {
        Chunk<T> ch(chunk, d.k, d.v);
        std::vector<T> s(static_cast<size_t>(kv)), vn(static_cast<size_t>(chunk * d.v));
        std::vector<T> o(static_cast<size_t>(chunk * d.v));
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < d.b * d.hv; ++unit) {
            const int64_t bb = unit / d.hv, hv = unit % d.hv;
            const UnitPtrs<T> u = unit_ptrs(q, k, v, g, beta, d, bb, hv);
            if (s0) {
                std::copy(s0 + unit * kv, s0 + (unit + 1) * kv, s.begin());
            } else {
                std::fill(s.begin(), s.end(), T(0));
            }
            for (int64_t c0 = 0; c0 < d.t; c0 += chunk) {
                const int64_t c = std::min(chunk, d.t - c0);
                if (resets(reset, bb, nchunks, c0 / chunk)) std::fill(s.begin(), s.end(), T(0));
                prepare_chunk(ch, u, c0, c, pairwise);
                new_values(ch, s.data(), vn.data());
                // O = Qg S + A Vn
                gemm(false, false, c, d.v, d.k, T(1), ch.qg.data(), d.k, s.data(), d.v, T(0), o.data(), d.v);
                gemm(false, false, c, d.v, c, T(1), ch.a.data(), c, vn.data(), d.v, T(1), o.data(), d.v);
                T* orow = out + (bb * d.t + c0) * d.hv * d.v + hv * d.v;
                for (int64_t r = 0; r < c; ++r) std::copy(&o[r * d.v], &o[(r + 1) * d.v], orow + r * u.vs);
                advance_state(ch, vn.data(), s.data());
            }
            if (st) std::copy(s.begin(), s.end(), st + unit * kv);
        }
    }
}

template <typename T>
void kda_chunked_bwd(const T* q,
                     const T* k,
                     const T* v,
                     const T* g,
                     const T* beta,
                     const T* s0,
                     const T* dout,
                     const T* dst,
                     T* dq,
                     T* dk,
                     T* dv,
                     T* dg,
                     T* dbeta,
                     T* ds0,
                     const KdaDims& d,
                     int64_t chunk,
                     bool pairwise,
                     const int32_t* reset) {
    blas_use_one_thread();
    const int64_t kv = d.k * d.v, group = d.hv / d.h, nchunks = (d.t + chunk - 1) / chunk;
    const int64_t qs = d.h * d.k, vs = d.hv * d.v, gs = d.hv * d.k;
#pragma omp parallel if (d.b * d.hv * d.t * kv >= kParallelMinWork)
    {
        Chunk<T> ch(chunk, d.k, d.v);
        ChunkGrads<T> gr(chunk, d.k, d.v);
        std::vector<T> hs(static_cast<size_t>(nchunks * kv));  // state entering each chunk
        std::vector<T> ds(static_cast<size_t>(kv)), dh(static_cast<size_t>(kv));
        std::vector<T> vn(static_cast<size_t>(chunk * d.v)), dov(static_cast<size_t>(chunk * d.v));
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < d.b * d.h; ++unit) {
            const int64_t bb = unit / d.h, h = unit % d.h;
            for (int64_t t = 0; t < d.t; ++t) {
                const int64_t row = bb * d.t + t;
                std::fill(dq + row * qs + h * d.k, dq + row * qs + (h + 1) * d.k, T(0));
                std::fill(dk + row * qs + h * d.k, dk + row * qs + (h + 1) * d.k, T(0));
            }
            for (int64_t hv = h * group; hv < (h + 1) * group; ++hv) {
                const int64_t sidx = bb * d.hv + hv;
                const UnitPtrs<T> u = unit_ptrs(q, k, v, g, beta, d, bb, hv);
                // Forward scan: the state entering every chunk.
                if (s0 && !resets(reset, bb, nchunks, 0)) {
                    std::copy(s0 + sidx * kv, s0 + (sidx + 1) * kv, hs.begin());
                } else {
                    std::fill(hs.begin(), hs.begin() + kv, T(0));
                }
                for (int64_t n = 0; n + 1 < nchunks; ++n) {
                    if (resets(reset, bb, nchunks, n + 1)) {
                        std::fill(&hs[(n + 1) * kv], &hs[(n + 2) * kv], T(0));
                        continue;
                    }
                    prepare_chunk(ch, u, n * chunk, chunk, pairwise);
                    new_values(ch, &hs[n * kv], vn.data());
                    std::copy(&hs[n * kv], &hs[(n + 1) * kv], &hs[(n + 1) * kv]);
                    advance_state(ch, vn.data(), &hs[(n + 1) * kv]);
                }
                // Reverse scan.
                if (dst) {
                    std::copy(dst + sidx * kv, dst + (sidx + 1) * kv, ds.begin());
                } else {
                    std::fill(ds.begin(), ds.end(), T(0));
                }
                for (int64_t n = nchunks - 1; n >= 0; --n) {
                    const int64_t c0 = n * chunk, c = std::min(chunk, d.t - c0);
                    prepare_chunk(ch, u, c0, c, pairwise);
                    load_rows(dout + (bb * d.t + c0) * vs + hv * d.v, vs, c, d.v, dov.data());
                    chunk_bwd(ch, gr, &hs[n * kv], dov.data(), ds.data(), dh.data(), pairwise);
                    std::swap(ds, dh);
                    // ds is the gradient of the state entering chunk n: none flows on where that state is zero.
                    if (resets(reset, bb, nchunks, n)) std::fill(ds.begin(), ds.end(), T(0));
                    for (int64_t r = 0; r < c; ++r) {
                        const int64_t row = bb * d.t + c0 + r;
                        for (int64_t x = 0; x < d.k; ++x) {
                            dq[row * qs + h * d.k + x] += gr.dq[r * d.k + x];
                            dk[row * qs + h * d.k + x] += gr.dk[r * d.k + x];
                            dg[row * gs + hv * d.k + x] = gr.dgam[r * d.k + x];
                        }
                        std::copy(&gr.dxu[r * d.v], &gr.dxu[(r + 1) * d.v], dv + row * vs + hv * d.v);
                        dbeta[row * d.hv + hv] = gr.dbeta[r];
                    }
                }
                if (ds0) std::copy(ds.begin(), ds.end(), ds0 + sidx * kv);
            }
        }
    }
}

#define MT_KDA_CHUNKED_INSTANTIATE(T)                 \
    template void kda_chunked_fwd<T>(const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     T*,              \
                                     T*,              \
                                     const KdaDims&,  \
                                     int64_t,         \
                                     bool,            \
                                     const int32_t*); \
    template void kda_chunked_bwd<T>(const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     const T*,        \
                                     T*,              \
                                     T*,              \
                                     T*,              \
                                     T*,              \
                                     T*,              \
                                     T*,              \
                                     const KdaDims&,  \
                                     int64_t,         \
                                     bool,            \
                                     const int32_t*);
MT_KDA_CHUNKED_INSTANTIATE(float)
MT_KDA_CHUNKED_INSTANTIATE(double)
#undef MT_KDA_CHUNKED_INSTANTIATE

}  // namespace mt::ops::cpu
