// CPU reference of the MoE router: per token, scores, a partial sort of s + b for the top K (+1 for the cutoff) with
// ties broken by the lower expert index, and gates; the backward through the gate normalisation and the score
// function. Rows are independent, so OpenMP splits them.
#include "ops/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/moe_router.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {
constexpr double kGateEps = 1e-20;  // moe.md §1.1
}  // namespace

template <typename T>
void moe_router_fwd(const T* logits,
                    const T* bias,
                    const int32_t* bias_rows,
                    T* scores,
                    int32_t* indices,
                    T* gates,
                    T* cutoff,
                    int64_t n,
                    int64_t e,
                    const MoeRouterOptions& options) {
    const int64_t k = options.top_k, kc = std::min(e, k + 1);
    const T rho = static_cast<T>(options.scale);
#pragma omp parallel if (n * e >= kParallelMinWork)
    {
        std::vector<int32_t> order(static_cast<size_t>(e));
        std::vector<T> key(static_cast<size_t>(e));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
            const T* z = logits + i * e;  // [E]
            T* s = scores + i * e;        // [E]
            if (options.score == MoeScore::sigmoid) {
                for (int64_t j = 0; j < e; ++j) s[j] = T(1) / (T(1) + std::exp(-z[j]));
            } else {
                const T zmax = *std::max_element(z, z + e);
                T sum = 0;
                for (int64_t j = 0; j < e; ++j) sum += (s[j] = std::exp(z[j] - zmax));
                for (int64_t j = 0; j < e; ++j) s[j] /= sum;
            }
            const T* b = bias && bias_rows ? bias + static_cast<int64_t>(bias_rows[i]) * e : bias;  // [E]
            for (int64_t j = 0; j < e; ++j) {  // a NaN key sorts last, so that the order stays strict
                const T v = s[j] + (b ? b[j] : T(0));
                key[static_cast<size_t>(j)] = std::isnan(v) ? -std::numeric_limits<T>::infinity() : v;
            }
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + kc, order.end(), [&](int32_t a, int32_t b) {
                const T ka = key[static_cast<size_t>(a)], kb = key[static_cast<size_t>(b)];
                return ka > kb || (ka == kb && a < b);
            });
            T sum = 0;
            for (int64_t q = 0; q < k; ++q) {
                indices[i * k + q] = order[static_cast<size_t>(q)];
                sum += s[order[static_cast<size_t>(q)]];
            }
            const T denom = options.normalize ? sum + static_cast<T>(kGateEps) : T(1);
            for (int64_t q = 0; q < k; ++q) gates[i * k + q] = rho * s[indices[i * k + q]] / denom;
            if (cutoff) cutoff[i] = key[static_cast<size_t>(order[static_cast<size_t>(k)])];
        }
    }
}

// ds_m = rho dg_m / S' - sum_q dg_q g_q / S' (normalize; S' = sum of the selected scores + 1e-20), rho dg_m otherwise;
// plus dscores. dz = ds s (1 - s) (sigmoid) or s (ds - sum_j ds_j s_j) (softmax).
template <typename T>
void moe_router_bwd(const T* scores,
                    const int32_t* indices,
                    const T* gates,
                    const T* dgates,
                    const T* dscores,
                    T* dlogits,
                    int64_t n,
                    int64_t e,
                    const MoeRouterOptions& options) {
    const int64_t k = options.top_k;
    const T rho = static_cast<T>(options.scale);
#pragma omp parallel for schedule(static) if (n * e >= kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) {
        const T* s = scores + i * e;  // [E]
        const int32_t* idx = indices + i * k;
        const T *g = gates + i * k, *dg = dgates + i * k;
        T* dz = dlogits + i * e;  // [E], holds ds first
        for (int64_t j = 0; j < e; ++j) dz[j] = dscores ? dscores[i * e + j] : T(0);
        if (options.normalize) {
            T sum = 0, dot = 0;
            for (int64_t q = 0; q < k; ++q) {
                sum += s[idx[q]];
                dot += dg[q] * g[q];
            }
            const T denom = sum + static_cast<T>(kGateEps);
            for (int64_t q = 0; q < k; ++q) dz[idx[q]] += (rho * dg[q] - dot) / denom;
        } else {
            for (int64_t q = 0; q < k; ++q) dz[idx[q]] += rho * dg[q];
        }
        if (options.score == MoeScore::sigmoid) {
            for (int64_t j = 0; j < e; ++j) dz[j] *= s[j] * (T(1) - s[j]);
        } else {
            T dot = 0;
            for (int64_t j = 0; j < e; ++j) dot += dz[j] * s[j];
            for (int64_t j = 0; j < e; ++j) dz[j] = s[j] * (dz[j] - dot);
        }
    }
}

#define MT_INSTANTIATE(T)                                                                                     \
    template void moe_router_fwd<T>(                                                                          \
        const T*, const T*, const int32_t*, T*, int32_t*, T*, T*, int64_t, int64_t, const MoeRouterOptions&); \
    template void moe_router_bwd<T>(                                                                          \
        const T*, const int32_t*, const T*, const T*, const T*, T*, int64_t, int64_t, const MoeRouterOptions&);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

// The CPU kernel of ops::moe_router_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_router_fwd(const Tensor& logits,
                    const Tensor& bias,
                    const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& cutoff,
                    const MoeRouterOptions& options,
                    const Tensor& bias_rows) {
    constexpr std::string_view op = "moe_router_fwd";
    const int64_t n = logits.size(0), e = logits.size(1);
    check_float_arg(logits, op, "logits", 2);
    check_float_arg(scores, op, "scores", 2);
    check_float_arg(gates, op, "gates", 2);
    check_dtype_as(scores, logits, op, "scores", "logits");
    check_dtype_as(gates, logits, op, "gates", "logits");
    if (bias.defined()) {
        check_float_arg(bias, op, "bias", bias_rows.defined() ? 2 : 1);
        check_dtype_as(bias, logits, op, "bias", "logits");
    }
    if (cutoff.defined()) {
        check_float_arg(cutoff, op, "cutoff", 1);
        check_dtype_as(cutoff, logits, op, "cutoff", "logits");
    }
    if (bias_rows.defined()) check_index_range(bias_rows, 0, bias.size(0), op, "bias_rows");
    MT_DISPATCH_FLOAT(logits.dtype(),
                      op,
                      cpu::moe_router_fwd(logits.data<scalar_t>(),
                                          data_or_null<scalar_t>(bias),
                                          bias_rows.defined() ? bias_rows.data<int32_t>() : nullptr,
                                          scores.data<scalar_t>(),
                                          indices.data<int32_t>(),
                                          gates.data<scalar_t>(),
                                          data_or_null<scalar_t>(cutoff),
                                          n,
                                          e,
                                          options));
}
MT_REGISTER_KERNEL(moe_router_fwd, cpu, moe_router_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::moe_router_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void moe_router_bwd(const Tensor& scores,
                    const Tensor& indices,
                    const Tensor& gates,
                    const Tensor& dgates,
                    const Tensor& dscores,
                    const Tensor& dlogits,
                    const MoeRouterOptions& options) {
    constexpr std::string_view op = "moe_router_bwd";
    const int64_t n = scores.size(0), e = scores.size(1);
    check_float_arg(scores, op, "scores", 2);
    check_float_arg(gates, op, "gates", 2);
    check_float_arg(dgates, op, "dgates", 2);
    check_float_arg(dlogits, op, "dlogits", 2);
    check_dtype_as(gates, scores, op, "gates", "scores");
    check_dtype_as(dgates, scores, op, "dgates", "scores");
    check_dtype_as(dlogits, scores, op, "dlogits", "scores");
    if (dscores.defined()) {
        check_float_arg(dscores, op, "dscores", 2);
        check_dtype_as(dscores, scores, op, "dscores", "scores");
    }
    check_index_range(indices, 0, e, op, "indices");
    const int32_t* idx = indices.data<int32_t>();
    MT_DISPATCH_FLOAT(scores.dtype(),
                      op,
                      cpu::moe_router_bwd(scores.data<scalar_t>(),
                                          idx,
                                          gates.data<scalar_t>(),
                                          dgates.data<scalar_t>(),
                                          data_or_null<scalar_t>(dscores),
                                          dlogits.data<scalar_t>(),
                                          n,
                                          e,
                                          options));
}
MT_REGISTER_KERNEL(moe_router_bwd, cpu, moe_router_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
