// CPU reference of the Block AttnRes mix: one pass per token over its m sources; the query and gain gradients sum
// fixed token blocks, then the blocks in order (the same bytes for any thread count).
#include "ops/cpu/attnres_mix.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/attnres_mix.h"
#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

constexpr int64_t kTokenBlock = 64;  // tokens per partial sum of dquery and dkey_gain

// Per token n: r[j] = sqrt(mean(v_j^2) + eps) and the logits s[j] = sum_c q[c] v_j[c] / r[j], q = query * gain.
template <typename T>
void logits(const T* const* v, const T* q, double eps, int64_t m, int64_t n, int64_t c, T* r, T* s) {
    for (int64_t j = 0; j < m; ++j) {
        const T* vr = v[j] + n * c;  // [c]
        T sum_sq = 0, dot = 0;
        for (int64_t k = 0; k < c; ++k) {
            sum_sq += vr[k] * vr[k];
            dot += q[k] * vr[k];
        }
        r[j] = static_cast<T>(std::sqrt(static_cast<double>(sum_sq) / static_cast<double>(c) + eps));
        s[j] = dot / r[j];
    }
}

}  // namespace

// With the residual blend lambda (attnres.md §5) the value weights are w_j = lambda / m + (1 - lambda) a_j; alpha
// keeps the softmax a_j itself.
template <typename T>
void attnres_mix_fwd(const T* const* v,
                     const T* query,
                     const T* gain,
                     double eps,
                     T* h,
                     T* alpha,
                     int64_t m,
                     int64_t n,
                     int64_t c,
                     double blend) {
    const T uniform = static_cast<T>(blend / static_cast<double>(m)), keep = static_cast<T>(1.0 - blend);
    std::vector<T> q(static_cast<size_t>(c));
    for (int64_t k = 0; k < c; ++k) q[k] = query[k] * gain[k];
#pragma omp parallel for schedule(static) if (n * c * m >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        T r[kMaxSources] = {}, s[kMaxSources] = {};
        logits(v, q.data(), eps, m, i, c, r, s);
        T* a = alpha + i * m;  // [m]
        const T smax = *std::max_element(s, s + m);
        T sum = 0;
        for (int64_t j = 0; j < m; ++j) sum += (a[j] = std::exp(s[j] - smax));
        for (int64_t j = 0; j < m; ++j) a[j] /= sum;
        T* hr = h + i * c;  // [c]
        for (int64_t k = 0; k < c; ++k) {
            T acc = 0;
            for (int64_t j = 0; j < m; ++j) acc += (uniform + keep * a[j]) * v[j][i * c + k];
            hr[k] = acc;
        }
    }
}

// With u_j = v_j / r_j, q = query * gain, da_j = dh . v_j, ds_j = (1 - lambda) a_j (da_j - sum_k a_k da_k):
//   dv_j     += w_j dh + ds_j / r_j (q - u_j mean(q * u_j))
//   dquery   += sum_j ds_j gain * u_j,   dgain += sum_j ds_j query * u_j
template <typename T>
void attnres_mix_bwd(const T* const* v,
                     const T* query,
                     const T* gain,
                     double eps,
                     const T* alpha,
                     const T* dh,
                     T* const* dv,
                     T* dquery,
                     T* dgain,
                     int64_t m,
                     int64_t n,
                     int64_t c,
                     double blend) {
    const T uniform = static_cast<T>(blend / static_cast<double>(m)), keep = static_cast<T>(1.0 - blend);
    std::vector<T> q(static_cast<size_t>(c));
    for (int64_t k = 0; k < c; ++k) q[k] = query[k] * gain[k];
    const int64_t blocks = (n + kTokenBlock - 1) / kTokenBlock;
    std::vector<T> partial(static_cast<size_t>(blocks * 2 * c), T(0));  // [blocks, 2, c]: dquery, dgain
#pragma omp parallel for schedule(static) if (n * c * m >= kParallelMinWork)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        T* pq = partial.data() + blk * 2 * c;  // [c]
        T* pg = pq + c;                        // [c]
        for (int64_t i = blk * kTokenBlock; i < std::min(n, (blk + 1) * kTokenBlock); ++i) {
            T r[kMaxSources] = {}, s[kMaxSources] = {}, da[kMaxSources] = {}, ds[kMaxSources] = {};
            logits(v, q.data(), eps, m, i, c, r, s);
            const T* a = alpha + i * m;  // [m]
            const T* dhr = dh + i * c;   // [c]
            T mean_da = 0;
            for (int64_t j = 0; j < m; ++j) {
                T dot = 0;
                for (int64_t k = 0; k < c; ++k) dot += dhr[k] * v[j][i * c + k];
                da[j] = dot;
                mean_da += a[j] * dot;
            }
            for (int64_t j = 0; j < m; ++j) {
                ds[j] = keep * a[j] * (da[j] - mean_da);
                const T w = uniform + keep * a[j];
                const T* vr = v[j] + i * c;                  // [c]
                T* dvr = dv[j] + i * c;                      // [c]
                const T qu_mean = s[j] / static_cast<T>(c);  // mean(q * u_j) = s_j / C
                for (int64_t k = 0; k < c; ++k) {
                    const T u = vr[k] / r[j];
                    dvr[k] += w * dhr[k] + ds[j] / r[j] * (q[k] - u * qu_mean);
                    pq[k] += ds[j] * gain[k] * u;
                    pg[k] += ds[j] * query[k] * u;
                }
            }
        }
    }
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int64_t k = 0; k < c; ++k) {
            dquery[k] += partial[(blk * 2) * c + k];
            dgain[k] += partial[(blk * 2 + 1) * c + k];
        }
}

template void attnres_mix_fwd<float>(
    const float* const*, const float*, const float*, double, float*, float*, int64_t, int64_t, int64_t, double);
template void attnres_mix_fwd<double>(
    const double* const*, const double*, const double*, double, double*, double*, int64_t, int64_t, int64_t, double);
template void attnres_mix_bwd<float>(const float* const*,
                                     const float*,
                                     const float*,
                                     double,
                                     const float*,
                                     const float*,
                                     float* const*,
                                     float*,
                                     float*,
                                     int64_t,
                                     int64_t,
                                     int64_t,
                                     double);
template void attnres_mix_bwd<double>(const double* const*,
                                      const double*,
                                      const double*,
                                      double,
                                      const double*,
                                      const double*,
                                      double* const*,
                                      double*,
                                      double*,
                                      int64_t,
                                      int64_t,
                                      int64_t,
                                      double);

namespace {

void check_cpu_floats(const std::vector<Tensor>& sources, std::initializer_list<NamedArg> others, std::string_view op) {
    for (size_t j = 0; j < sources.size(); ++j) check_float_arg(sources[j], op, fmt::format("sources[{}]", j), 2);
    for (const NamedArg& a : others) {
        check_float_arg(a.tensor, op, a.name, a.tensor.ndim());
        check_dtype_as(a.tensor, sources[0], op, a.name, "the sources");
    }
}

template <typename T>
std::vector<const T*> const_ptrs(const std::vector<Tensor>& ts) {
    std::vector<const T*> out;
    for (const Tensor& t : ts) out.push_back(t.data<T>());
    return out;
}

template <typename T>
std::vector<T*> ptrs(const std::vector<Tensor>& ts) {
    std::vector<T*> out;
    for (const Tensor& t : ts) out.push_back(t.data<T>());
    return out;
}

}  // namespace

// The CPU kernel of ops::attnres_mix_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void attnres_mix_fwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& h,
                     const Tensor& alpha,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_fwd";
    const int64_t m = static_cast<int64_t>(sources.size()), n = sources[0].size(0), c = sources[0].size(1);
    check_cpu_floats(sources, {{"query", query}, {"key_gain", key_gain}, {"h", h}, {"alpha", alpha}}, op);
    MT_DISPATCH_FLOAT(sources[0].dtype(), op, {
        const auto v = const_ptrs<scalar_t>(sources);
        cpu::attnres_mix_fwd(v.data(),
                             query.data<scalar_t>(),
                             key_gain.data<scalar_t>(),
                             eps,
                             h.data<scalar_t>(),
                             alpha.data<scalar_t>(),
                             m,
                             n,
                             c,
                             blend);
    });
}
MT_REGISTER_KERNEL(attnres_mix_fwd, cpu, attnres_mix_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::attnres_mix_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void attnres_mix_bwd(const std::vector<Tensor>& sources,
                     const Tensor& query,
                     const Tensor& key_gain,
                     double eps,
                     const Tensor& alpha,
                     const Tensor& dh,
                     const std::vector<Tensor>& d_sources,
                     const Tensor& dquery,
                     const Tensor& dkey_gain,
                     double blend) {
    constexpr std::string_view op = "attnres_mix_bwd";
    const int64_t m = static_cast<int64_t>(sources.size()), n = sources[0].size(0), c = sources[0].size(1);
    check_cpu_floats(sources,
                     {{"query", query},
                      {"key_gain", key_gain},
                      {"alpha", alpha},
                      {"dh", dh},
                      {"dquery", dquery},
                      {"dkey_gain", dkey_gain}},
                     op);
    check_cpu_floats(d_sources, {}, op);
    check_dtype_as(d_sources[0], sources[0], op, "d_sources", "the sources");
    MT_DISPATCH_FLOAT(sources[0].dtype(), op, {
        const auto v = const_ptrs<scalar_t>(sources);
        const auto dv = ptrs<scalar_t>(d_sources);
        cpu::attnres_mix_bwd(v.data(),
                             query.data<scalar_t>(),
                             key_gain.data<scalar_t>(),
                             eps,
                             alpha.data<scalar_t>(),
                             dh.data<scalar_t>(),
                             dv.data(),
                             dquery.data<scalar_t>(),
                             dkey_gain.data<scalar_t>(),
                             m,
                             n,
                             c,
                             blend);
    });
}
MT_REGISTER_KERNEL(attnres_mix_bwd, cpu, attnres_mix_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
