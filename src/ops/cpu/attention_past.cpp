// CPU reference of attention over a past key block merged into a running result (ops/attention_past.h): plain loops
// over every (batch, query, head), f32 or f64 throughout. The backward's sums over queries (dk, dv) run per (batch,
// kv head) task in a fixed order, so they are deterministic at any thread count.
#include "ops/attention_past.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

struct Dims {
    int64_t b, t, tk, hq, hkv, d;
};

template <typename T>
T dot(const T* a, const T* b, int64_t d) {
    T s = 0;
    for (int64_t c = 0; c < d; ++c) s += a[c] * b[c];
    return s;
}

// The first visible key of query (bb, i).
int64_t first_of(const int32_t* first, const Dims& n, int64_t bb, int64_t i) {
    return first != nullptr ? first[bb * n.t + i] : 0;
}

template <typename T>
void past_fwd(const T* q, const T* k, const T* v, const int32_t* first, T* out, T* lse, T* max_logit, const Dims& n) {
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n.d)));
    const int64_t group = n.hq / n.hkv;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < n.b * n.t; ++bt) {
        std::vector<T> s(static_cast<size_t>(n.tk));
        const int64_t bb = bt / n.t, i = bt % n.t, lo = first_of(first, n, bb, i);
        if (lo >= n.tk) continue;  // none of the block is visible: the row keeps its result
        for (int64_t h = 0; h < n.hq; ++h) {
            const int64_t kh = h / group;
            const T* qrow = q + (bt * n.hq + h) * n.d;
            T* orow = out + (bt * n.hq + h) * n.d;
            T& l = lse[(bb * n.hq + h) * n.t + i];
            T mx = -std::numeric_limits<T>::infinity();
            for (int64_t j = lo; j < n.tk; ++j) {
                s[static_cast<size_t>(j)] = dot(qrow, k + ((bb * n.tk + j) * n.hkv + kh) * n.d, n.d) * scale;
                mx = std::max(mx, s[static_cast<size_t>(j)]);
            }
            if (max_logit != nullptr) {
                T& m = max_logit[(bb * n.hq + h) * n.t + i];
                m = std::max(m, mx);
            }
            const T top = std::max(mx, l);  // l = -inf: nothing merged yet
            T sum = std::exp(l - top);
            for (int64_t j = lo; j < n.tk; ++j) sum += std::exp(s[static_cast<size_t>(j)] - top);
            const T merged = top + std::log(sum), keep = std::exp(l - merged);
            for (int64_t c = 0; c < n.d; ++c) orow[c] *= keep;
            for (int64_t j = lo; j < n.tk; ++j) {
                const T p = std::exp(s[static_cast<size_t>(j)] - merged);
                const T* vrow = v + ((bb * n.tk + j) * n.hkv + kh) * n.d;
                for (int64_t c = 0; c < n.d; ++c) orow[c] += p * vrow[c];
            }
            l = merged;
        }
    }
}

// One task per (batch row, kv head): dk, dv of its keys written in query order, and the dq rows of its query heads
// (no other task touches them).
template <typename T>
void past_bwd(const T* q,
              const T* k,
              const T* v,
              const int32_t* first,
              const T* out,
              const T* lse,
              const T* dout,
              T* dq,
              T* dk,
              T* dv,
              const Dims& n) {
    const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(n.d)));
    const int64_t group = n.hq / n.hkv;
#pragma omp parallel for schedule(static)
    for (int64_t unit = 0; unit < n.b * n.hkv; ++unit) {
        const int64_t bb = unit / n.hkv, kh = unit % n.hkv;
        for (int64_t j = 0; j < n.tk; ++j) {
            const int64_t row = ((bb * n.tk + j) * n.hkv + kh) * n.d;
            std::fill(dk + row, dk + row + n.d, T(0));
            std::fill(dv + row, dv + row + n.d, T(0));
        }
        for (int64_t i = 0; i < n.t; ++i) {
            const int64_t lo = first_of(first, n, bb, i);
            for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
                const int64_t qr = ((bb * n.t + i) * n.hq + h) * n.d;
                const T l = lse[(bb * n.hq + h) * n.t + i], delta = dot(dout + qr, out + qr, n.d);
                for (int64_t j = lo; j < n.tk; ++j) {
                    const int64_t kr = ((bb * n.tk + j) * n.hkv + kh) * n.d;
                    const T p = std::exp(dot(q + qr, k + kr, n.d) * scale - l);
                    const T ds = p * (dot(dout + qr, v + kr, n.d) - delta);
                    for (int64_t c = 0; c < n.d; ++c) {
                        dq[qr + c] += ds * k[kr + c] * scale;
                        dk[kr + c] += ds * q[qr + c] * scale;
                        dv[kr + c] += p * dout[qr + c];
                    }
                }
            }
        }
    }
}

Dims dims_of(const Tensor& q, const Tensor& k) {
    return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
}

}  // namespace

void attention_past_fwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& max_logit) {
    constexpr std::string_view op = "attention_past_fwd";
    check_float_args_like_q(q, {{"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"max_logit", max_logit}}, op);
    const int32_t* f = first.defined() ? first.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      past_fwd(q.data<scalar_t>(),
                               k.data<scalar_t>(),
                               v.data<scalar_t>(),
                               f,
                               out.data<scalar_t>(),
                               lse.data<scalar_t>(),
                               data_or_null<scalar_t>(max_logit),
                               dims_of(q, k)));
}
MT_REGISTER_KERNEL(attention_past_fwd, cpu, attention_past_fwd, ::mt::ops::float_dtypes);

void attention_past_bwd(const Tensor& q,
                        const Tensor& k,
                        const Tensor& v,
                        const Tensor& first,
                        const Tensor& out,
                        const Tensor& lse,
                        const Tensor& dout,
                        const Tensor& dq,
                        const Tensor& dk,
                        const Tensor& dv) {
    constexpr std::string_view op = "attention_past_bwd";
    check_float_args_like_q(
        q, {{"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}}, op);
    const int32_t* f = first.defined() ? first.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(q.dtype(),
                      op,
                      past_bwd(q.data<scalar_t>(),
                               k.data<scalar_t>(),
                               v.data<scalar_t>(),
                               f,
                               out.data<scalar_t>(),
                               lse.data<scalar_t>(),
                               dout.data<scalar_t>(),
                               dq.data<scalar_t>(),
                               dk.data<scalar_t>(),
                               dv.data<scalar_t>(),
                               dims_of(q, k)));
}
MT_REGISTER_KERNEL(attention_past_bwd, cpu, attention_past_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
