// CPU reference of KDA as the token loop of kda.md §2, the specification the chunked algorithm is tested against.
// One task per (batch, q/k head) runs the value heads of its group in order, so the dq and dk sums over a group
// have a fixed order. The backward first re-runs the loop keeping every state S_{t-1} (t * K * V values per value
// head: a reference for tests, not for long sequences), then walks back token by token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/kda.h"
#include "ops/cpu/threading.h"

namespace mt::ops::cpu {

namespace {

// Row pointers of one (batch, value head): token t's q/k row is q + t * qs, its v row v + t * vs, and so on.
struct RowStrides {
    int64_t qs, vs, gs, bs;
};

RowStrides row_strides(const KdaDims& d) {
    return {d.h * d.k, d.hv * d.v, d.hv * d.k, d.hv};
}

// One step of the recurrence on S [K, V]: S = Diag(alpha) S; p = S^T k; S += beta k (v - p)^T; o = S^T q.
template <typename T>
void step_fwd(T* s, const T* q, const T* k, const T* v, const T* g, T beta, T* o, T* p, int64_t kd, int64_t vd) {
    for (int64_t i = 0; i < kd; ++i) {
        const T a = std::exp(g[i]);
        for (int64_t j = 0; j < vd; ++j) s[i * vd + j] *= a;
    }
    std::fill(p, p + vd, T(0));
    for (int64_t i = 0; i < kd; ++i)
        for (int64_t j = 0; j < vd; ++j) p[j] += s[i * vd + j] * k[i];
    for (int64_t i = 0; i < kd; ++i)
        for (int64_t j = 0; j < vd; ++j) s[i * vd + j] += beta * k[i] * (v[j] - p[j]);
    if (!o) return;
    std::fill(o, o + vd, T(0));
    for (int64_t i = 0; i < kd; ++i)
        for (int64_t j = 0; j < vd; ++j) o[j] += s[i * vd + j] * q[i];
}

}  // namespace

template <typename T>
void kda_recurrent_fwd(
    const T* q, const T* k, const T* v, const T* g, const T* beta, const T* s0, T* out, T* st, const KdaDims& d) {
    const RowStrides rs = row_strides(d);
    const int64_t group = d.hv / d.h, kv = d.k * d.v;
#pragma omp parallel if (d.b * d.hv * d.t * kv >= kParallelMinWork)
    {
        std::vector<T> s(static_cast<size_t>(kv)), p(static_cast<size_t>(d.v));
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < d.b * d.hv; ++unit) {
            const int64_t bb = unit / d.hv, hv = unit % d.hv, h = hv / group;
            if (s0) {
                std::copy(s0 + unit * kv, s0 + (unit + 1) * kv, s.begin());
            } else {
                std::fill(s.begin(), s.end(), T(0));
            }
            for (int64_t t = 0; t < d.t; ++t) {
                const int64_t row = bb * d.t + t;
                step_fwd(s.data(),
                         q + row * rs.qs + h * d.k,
                         k + row * rs.qs + h * d.k,
                         v + row * rs.vs + hv * d.v,
                         g + row * rs.gs + hv * d.k,
                         beta[row * rs.bs + hv],
                         out + row * rs.vs + hv * d.v,
                         p.data(),
                         d.k,
                         d.v);
            }
            if (st) std::copy(s.begin(), s.end(), st + unit * kv);
        }
    }
}

// Reverse step, with S~ = Diag(alpha) S_{t-1}, p = S~^T k, S_t = S~ + beta k (v - p)^T, o = S_t^T q, and dS the
// gradient of S_t (already holding q do^T):
//   w = dS^T k;  dv = beta w;  dbeta = (v - p) . w;  dk = beta dS (v - p) - beta S~ w
//   dS~ = dS - beta k w^T;  dS_{t-1} = Diag(alpha) dS~;  dg = alpha * rowsum(S_{t-1} * dS~)
template <typename T>
void kda_recurrent_bwd(const T* q,
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
                       const KdaDims& d) {
    const RowStrides rs = row_strides(d);
    const int64_t group = d.hv / d.h, kv = d.k * d.v, kd = d.k, vd = d.v;
#pragma omp parallel if (d.b * d.hv * d.t * kv >= kParallelMinWork)
    {
        std::vector<T> states(static_cast<size_t>((d.t + 1) * kv));  // S_0 .. S_T
        std::vector<T> ds(static_cast<size_t>(kv)), stil(static_cast<size_t>(kv));
        std::vector<T> p(static_cast<size_t>(vd)), w(static_cast<size_t>(vd)), r(static_cast<size_t>(vd));
#pragma omp for schedule(dynamic, 1)
        for (int64_t unit = 0; unit < d.b * d.h; ++unit) {
            const int64_t bb = unit / d.h, h = unit % d.h;
            for (int64_t t = 0; t < d.t; ++t) {
                const int64_t row = bb * d.t + t;
                std::fill(dq + row * rs.qs + h * kd, dq + row * rs.qs + (h + 1) * kd, T(0));
                std::fill(dk + row * rs.qs + h * kd, dk + row * rs.qs + (h + 1) * kd, T(0));
            }
            for (int64_t hv = h * group; hv < (h + 1) * group; ++hv) {
                const int64_t sidx = bb * d.hv + hv;  // state index
                T* s = states.data();
                if (s0) {
                    std::copy(s0 + sidx * kv, s0 + (sidx + 1) * kv, s);
                } else {
                    std::fill(s, s + kv, T(0));
                }
                for (int64_t t = 0; t < d.t; ++t) {
                    const int64_t row = bb * d.t + t;
                    std::copy(s + t * kv, s + (t + 1) * kv, s + (t + 1) * kv);
                    step_fwd(s + (t + 1) * kv,
                             q + row * rs.qs + h * kd,
                             k + row * rs.qs + h * kd,
                             v + row * rs.vs + hv * vd,
                             g + row * rs.gs + hv * kd,
                             beta[row * rs.bs + hv],
                             static_cast<T*>(nullptr),
                             p.data(),
                             kd,
                             vd);
                }
                if (dst) {
                    std::copy(dst + sidx * kv, dst + (sidx + 1) * kv, ds.begin());
                } else {
                    std::fill(ds.begin(), ds.end(), T(0));
                }
                for (int64_t t = d.t - 1; t >= 0; --t) {
                    const int64_t row = bb * d.t + t;
                    const T* qt = q + row * rs.qs + h * kd;
                    const T* kt = k + row * rs.qs + h * kd;
                    const T* vt = v + row * rs.vs + hv * vd;
                    const T* gt = g + row * rs.gs + hv * kd;
                    const T* dot = dout + row * rs.vs + hv * vd;
                    const T bt = beta[row * rs.bs + hv];
                    const T* sprev = s + t * kv;  // S_{t-1}
                    const T* scur = s + (t + 1) * kv;
                    T* dqt = dq + row * rs.qs + h * kd;
                    T* dkt = dk + row * rs.qs + h * kd;
                    for (int64_t i = 0; i < kd; ++i) {  // o = S_t^T q: dq = S_t do, dS += q do^T
                        T acc = 0;
                        for (int64_t j = 0; j < vd; ++j) {
                            acc += scur[i * vd + j] * dot[j];
                            ds[i * vd + j] += qt[i] * dot[j];
                        }
                        dqt[i] += acc;
                    }
                    for (int64_t i = 0; i < kd; ++i) {
                        const T a = std::exp(gt[i]);
                        for (int64_t j = 0; j < vd; ++j) stil[i * vd + j] = a * sprev[i * vd + j];
                    }
                    std::fill(p.begin(), p.end(), T(0));
                    std::fill(w.begin(), w.end(), T(0));
                    for (int64_t i = 0; i < kd; ++i) {
                        for (int64_t j = 0; j < vd; ++j) {
                            p[j] += stil[i * vd + j] * kt[i];
                            w[j] += ds[i * vd + j] * kt[i];
                        }
                    }
                    T db = 0;
                    for (int64_t j = 0; j < vd; ++j) {
                        r[j] = vt[j] - p[j];
                        dv[row * rs.vs + hv * vd + j] = bt * w[j];
                        db += r[j] * w[j];
                    }
                    dbeta[row * rs.bs + hv] = db;
                    for (int64_t i = 0; i < kd; ++i) {
                        T acc = 0;
                        for (int64_t j = 0; j < vd; ++j) acc += ds[i * vd + j] * r[j] - stil[i * vd + j] * w[j];
                        dkt[i] += bt * acc;
                    }
                    for (int64_t i = 0; i < kd; ++i) {
                        const T a = std::exp(gt[i]);
                        T acc = 0;
                        for (int64_t j = 0; j < vd; ++j) {
                            const T dsil = ds[i * vd + j] - bt * kt[i] * w[j];
                            acc += sprev[i * vd + j] * dsil;
                            ds[i * vd + j] = a * dsil;
                        }
                        dg[row * rs.gs + hv * kd + i] = a * acc;
                    }
                }
                if (ds0) std::copy(ds.begin(), ds.end(), ds0 + sidx * kv);
            }
        }
    }
}

#define MT_KDA_RECURRENT_INSTANTIATE(T)                                                      \
    template void kda_recurrent_fwd<T>(                                                      \
        const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, const KdaDims&); \
    template void kda_recurrent_bwd<T>(const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       const T*,                                             \
                                       T*,                                                   \
                                       T*,                                                   \
                                       T*,                                                   \
                                       T*,                                                   \
                                       T*,                                                   \
                                       T*,                                                   \
                                       const KdaDims&);
MT_KDA_RECURRENT_INSTANTIATE(float)
MT_KDA_RECURRENT_INSTANTIATE(double)
#undef MT_KDA_RECURRENT_INSTANTIATE

}  // namespace mt::ops::cpu
