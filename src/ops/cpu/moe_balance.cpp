// CPU references of the MoE balancing counters and the aux loss (ops/moe_balance.h): plain loops in a fixed order
// (the counts are exact; the float sums run token by token), so results do not depend on the thread count.
#include "ops/moe_balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// Adds the QB histogram counts of one micro-batch: for every token i and expert j, r = c_i - s_ij into bin
// clamp(floor((r - L) B / (U - L)), 0, B - 1) of row j (in double, so the bins do not depend on the scores' dtype
// beyond their values).
// group (or null): only the tokens with group[i] == keep count.
template <typename T>
void add_histogram(const T* s,
                   const T* cutoff,
                   int64_t n_tok,
                   int64_t n,
                   int64_t bins,
                   double lo,
                   double hi,
                   int64_t* hist,
                   const int32_t* group,
                   int32_t keep) {
    const double scale = static_cast<double>(bins) / (hi - lo);
    for (int64_t i = 0; i < n_tok; ++i) {
        if (group && group[i] != keep) continue;
        const double c = static_cast<double>(cutoff[i]);
        for (int64_t j = 0; j < n; ++j) {
            const double r = c - static_cast<double>(s[i * n + j]);
            const double t = std::floor((r - lo) * scale);
            const int64_t bin =
                std::isnan(t) ? 0 : static_cast<int64_t>(std::clamp(t, 0.0, static_cast<double>(bins - 1)));
            ++hist[j * bins + bin];
        }
    }
}

// sum over tokens of H(p_t) / ln n with p_t = s_t / sum_j s_tj.
template <typename T>
double entropy_sum(const T* s, int64_t n_tok, int64_t n) {
    if (n <= 1) return 0.0;
    const double log_n = std::log(static_cast<double>(n));
    double total = 0;
    for (int64_t i = 0; i < n_tok; ++i) {
        const T* si = s + i * n;
        const double sum = std::accumulate(si, si + n, 0.0);
        double h = 0;
        for (int64_t j = 0; j < n; ++j) {
            const double p = static_cast<double>(si[j]) / sum;
            if (p > 0) h -= p * std::log(p);
        }
        total += h / log_n;
    }
    return total;
}

// The aux loss and, when ds is given, its gradient through P (moe.md §2.3).
template <typename T>
double aux_loss_impl(
    const T* s, const int32_t* idx, int64_t n_tok, int64_t n, int64_t k, double coeff, bool probs, T* ds) {
    std::vector<double> count(static_cast<size_t>(n), 0.0), p_mean(static_cast<size_t>(n), 0.0);
    for (int64_t q = 0; q < n_tok * k; ++q) count[static_cast<size_t>(idx[q])] += 1.0;
    for (int64_t i = 0; i < n_tok; ++i) {
        double sum = 1.0;
        if (!probs) sum = std::accumulate(s + i * n, s + (i + 1) * n, 0.0);
        for (int64_t j = 0; j < n; ++j) p_mean[static_cast<size_t>(j)] += static_cast<double>(s[i * n + j]) / sum;
    }
    const double t = static_cast<double>(n_tok);
    std::vector<double> g(static_cast<size_t>(n));  // d loss / d p_tj = alpha f_j / T
    double loss = 0;
    for (int64_t j = 0; j < n; ++j) {
        const double f = static_cast<double>(n) * count[static_cast<size_t>(j)] / (static_cast<double>(k) * t);
        loss += coeff * f * p_mean[static_cast<size_t>(j)] / t;
        g[static_cast<size_t>(j)] = coeff * f / t;
    }
    if (!ds) return loss;
    for (int64_t i = 0; i < n_tok; ++i) {
        const T* si = s + i * n;
        T* di = ds + i * n;
        if (probs) {
            for (int64_t j = 0; j < n; ++j) di[j] = static_cast<T>(g[static_cast<size_t>(j)]);
            continue;
        }
        // p = s / S: ds_m = (g_m - sum_j g_j p_j) / S
        const double sum = std::accumulate(si, si + n, 0.0);
        double dot = 0;
        for (int64_t j = 0; j < n; ++j) dot += g[static_cast<size_t>(j)] * static_cast<double>(si[j]) / sum;
        for (int64_t j = 0; j < n; ++j) di[j] = static_cast<T>((g[static_cast<size_t>(j)] - dot) / sum);
    }
    return loss;
}

}  // namespace

void moe_expert_counts(const Tensor& indices, const Tensor& counts, const Tensor& group, int32_t keep) {
    const int32_t* idx = indices.data<int32_t>();
    int64_t* c = counts.data<int64_t>();
    check_index_range(indices, 0, counts.size(0), "moe_expert_counts", "indices");
    const int64_t k = indices.size(1);
    const int32_t* g = group.defined() ? group.data<int32_t>() : nullptr;
    for (int64_t s = 0; s < indices.numel(); ++s)
        if (!g || g[s / k] == keep) ++c[idx[s]];
}
MT_REGISTER_KERNEL(moe_expert_counts, cpu, moe_expert_counts, ::mt::ops::any_dtype);  // primary: indices i32

void moe_qb_histogram(const Tensor& scores,
                      const Tensor& cutoff,
                      double lower,
                      double upper,
                      const Tensor& hist,
                      const Tensor& group,
                      int32_t keep) {
    constexpr std::string_view op = "moe_qb_histogram";
    check_float_arg(scores, op, "scores", 2);
    const int64_t n = scores.size(0), e = scores.size(1), bins = hist.size(1);
    const int32_t* g = group.defined() ? group.data<int32_t>() : nullptr;
    MT_DISPATCH_FLOAT(
        scores.dtype(),
        op,
        add_histogram(
            scores.data<scalar_t>(), cutoff.data<scalar_t>(), n, e, bins, lower, upper, hist.data<int64_t>(), g, keep));
}
MT_REGISTER_KERNEL(moe_qb_histogram, cpu, moe_qb_histogram, ::mt::ops::float_dtypes);

void moe_token_entropy_sum(const Tensor& scores, const Tensor& acc) {
    constexpr std::string_view op = "moe_token_entropy_sum";
    check_float_arg(scores, op, "scores", 2);
    double sum = 0.0;
    MT_DISPATCH_FLOAT(scores.dtype(), op, sum = entropy_sum(scores.data<scalar_t>(), scores.size(0), scores.size(1)));
    acc.data<double>()[0] += sum;
}
MT_REGISTER_KERNEL(moe_token_entropy_sum, cpu, moe_token_entropy_sum, ::mt::ops::float_dtypes);

double moe_aux_loss(const Tensor& scores, const Tensor& indices, double coeff, bool probs, const Tensor& dscores) {
    constexpr std::string_view op = "moe_aux_loss";
    check_float_arg(scores, op, "scores", 2);
    const int64_t n = scores.size(0), e = scores.size(1), k = indices.size(1);
    check_index_range(indices, 0, e, op, "indices");
    double loss = 0.0;
    MT_DISPATCH_FLOAT(scores.dtype(),
                      op,
                      loss = aux_loss_impl(scores.data<scalar_t>(),
                                           indices.data<int32_t>(),
                                           n,
                                           e,
                                           k,
                                           coeff,
                                           probs,
                                           dscores.defined() ? dscores.data<scalar_t>() : nullptr));
    return loss;
}
MT_REGISTER_KERNEL(moe_aux_loss, cpu, moe_aux_loss, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
