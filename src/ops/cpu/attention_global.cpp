// CPU reference of the global-token and sink merge of attention (ops/attention_global.h): plain loops over every
// (batch, query, head), f32 or f64 throughout. The backward's sums over queries (dkg, dvg, dsink) run per kv head
// in a fixed order, one task per kv head, so they are deterministic at any thread count.
#include "ops/attention_global.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

struct Dims {
    int64_t b, t, hq, hkv, g, d;
};

Dims dims_of(const Tensor& q, const Tensor& kg) {
    return {q.size(0), q.size(1), q.size(2), kg.defined() ? kg.size(1) : 1, kg.defined() ? kg.size(0) : 0, q.size(3)};
}

template <typename T>
T dot(const T* a, const T* b, int64_t d) {
    T s = 0;
    for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
    return s;
}

// Row (bb, i, h): the scores of the global keys into s[0, g), and lse' (the merged log-sum-exp) returned.
template <typename T>
T merged_scores(const T* qrow, const T* kg, const T* sink, T lse, const Dims& n, int64_t h, T scale, T* s) {
    const int64_t kh = h / (n.hq / n.hkv);
    T mx = lse;
    for (int64_t j = 0; j < n.g; ++j) {
        s[j] = dot(qrow, kg + (j * n.hkv + kh) * n.d, n.d) * scale;
        mx = std::max(mx, s[j]);
    }
    if (sink != nullptr) mx = std::max(mx, sink[h]);
    T sum = std::exp(lse - mx);
    for (int64_t j = 0; j < n.g; ++j) sum += std::exp(s[j] - mx);
    if (sink != nullptr) sum += std::exp(sink[h] - mx);
    return mx + std::log(sum);
}

template <typename T>
void global_fwd(const T* q, const T* kg, const T* vg, const T* sink, T* out, T* lse, const Dims& n) {
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n.d)));
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < n.b * n.t; ++bt) {
        std::vector<T> s(static_cast<size_t>(n.g));
        const int64_t bb = bt / n.t, i = bt % n.t;
        for (int64_t h = 0; h < n.hq; ++h) {
            const T* qrow = q + (bt * n.hq + h) * n.d;
            T* orow = out + (bt * n.hq + h) * n.d;
            T& l = lse[(bb * n.hq + h) * n.t + i];
            const T merged = merged_scores(qrow, kg, sink, l, n, h, scale, s.data());
            const T keep = std::exp(l - merged), kh = h / (n.hq / n.hkv);
            for (int64_t c = 0; c < n.d; ++c) orow[c] *= keep;
            for (int64_t j = 0; j < n.g; ++j) {
                const T p = std::exp(s[static_cast<size_t>(j)] - merged);
                const T* vrow = vg + (j * n.hkv + static_cast<int64_t>(kh)) * n.d;
                for (int64_t c = 0; c < n.d; ++c) orow[c] += p * vrow[c];
            }
            l = merged;
        }
    }
}

// dq += sum_j ds_j kg_j scale per row; then per kv head, in row order: dkg, dvg written and dsink accumulated.
template <typename T>
void global_bwd(const T* q,
                const T* kg,
                const T* vg,
                const T* sink,
                const T* out,
                const T* lse,
                const T* dout,
                T* dq,
                T* dkg,
                T* dvg,
                T* dsink,
                const Dims& n) {
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n.d)));
    const int64_t group = n.hq / n.hkv;
#pragma omp parallel for schedule(static)
    for (int64_t kh = 0; kh < n.hkv; ++kh) {
        T* dk = dkg != nullptr ? dkg + kh * n.d : nullptr;  // rows j * hkv + kh
        T* dv = dvg != nullptr ? dvg + kh * n.d : nullptr;
        for (int64_t j = 0; j < n.g; ++j) {
            std::fill(dk + j * n.hkv * n.d, dk + j * n.hkv * n.d + n.d, T(0));
            std::fill(dv + j * n.hkv * n.d, dv + j * n.hkv * n.d + n.d, T(0));
        }
        for (int64_t bt = 0; bt < n.b * n.t; ++bt) {
            const int64_t bb = bt / n.t, i = bt % n.t;
            for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
                const int64_t row = (bt * n.hq + h) * n.d;
                const T l = lse[(bb * n.hq + h) * n.t + i], delta = dot(dout + row, out + row, n.d);
                for (int64_t j = 0; j < n.g; ++j) {
                    const T* krow = kg + (j * n.hkv + kh) * n.d;
                    const T* vrow = vg + (j * n.hkv + kh) * n.d;
                    const T p = std::exp(dot(q + row, krow, n.d) * scale - l);
                    const T ds = p * (dot(dout + row, vrow, n.d) - delta);
                    T* dkrow = dk + j * n.hkv * n.d;
                    T* dvrow = dv + j * n.hkv * n.d;
                    for (int64_t c = 0; c < n.d; ++c) {
                        dq[row + c] += ds * krow[c] * scale;
                        dkrow[c] += ds * q[row + c] * scale;
                        dvrow[c] += p * dout[row + c];
                    }
                }
                if (sink != nullptr) dsink[h] -= std::exp(sink[h] - l) * delta;
            }
        }
    }
}

}  // namespace

void attention_global_fwd(
    const Tensor& q, const Tensor& kg, const Tensor& vg, const Tensor& sink, const Tensor& out, const Tensor& lse) {
    constexpr std::string_view op = "attention_global_fwd";
    check_float_args_like_q(q, {{"kg", kg}, {"vg", vg}, {"sink", sink}, {"out", out}, {"lse", lse}}, op);
    const Dims n = dims_of(q, kg);
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      global_fwd(q.data<scalar_t>(),
                                 data_or_null<scalar_t>(kg),
                                 data_or_null<scalar_t>(vg),
                                 data_or_null<scalar_t>(sink),
                                 out.data<scalar_t>(),
                                 lse.data<scalar_t>(),
                                 n));
}
MT_REGISTER_KERNEL(attention_global_fwd, cpu, attention_global_fwd, ::mt::ops::float_dtypes);

void attention_global_bwd(const Tensor& q,
                          const Tensor& kg,
                          const Tensor& vg,
                          const Tensor& sink,
                          const Tensor& out,
                          const Tensor& lse,
                          const Tensor& dout,
                          const Tensor& dq,
                          const Tensor& dkg,
                          const Tensor& dvg,
                          const Tensor& dsink) {
    constexpr std::string_view op = "attention_global_bwd";
    check_float_args_like_q(q,
                            {{"kg", kg},
                             {"vg", vg},
                             {"sink", sink},
                             {"out", out},
                             {"lse", lse},
                             {"dout", dout},
                             {"dq", dq},
                             {"dkg", dkg},
                             {"dvg", dvg},
                             {"dsink", dsink}},
                            op);
    const Dims n = dims_of(q, kg);
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      global_bwd(q.data<scalar_t>(),
                                 data_or_null<scalar_t>(kg),
                                 data_or_null<scalar_t>(vg),
                                 data_or_null<scalar_t>(sink),
                                 out.data<scalar_t>(),
                                 lse.data<scalar_t>(),
                                 dout.data<scalar_t>(),
                                 dq.data<scalar_t>(),
                                 data_or_null<scalar_t>(dkg),
                                 data_or_null<scalar_t>(dvg),
                                 data_or_null<scalar_t>(dsink),
                                 n));
}
MT_REGISTER_KERNEL(attention_global_bwd, cpu, attention_global_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
