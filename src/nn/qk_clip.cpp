// QK-clip's row factors and their in-place application (muon.md §4).
#include "nn/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace mt::nn {

namespace {

void check_heads(int64_t n_heads, int64_t n_kv_heads) {
    MT_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
             "QK-clip: {} query heads do not split into {} kv groups",
             n_heads,
             n_kv_heads);
}

// Scales the contiguous elements [lo, hi) of the flat weight `flat` (rows of `cols` elements) in place.
template <typename T>
void scale_host(T* data, int64_t lo, int64_t hi, int64_t cols, const std::vector<double>& row_scale) {
    for (int64_t e = lo; e < hi; ++e) {
        const double s = row_scale[static_cast<size_t>(e / cols)];
        data[e - lo] = static_cast<T>(static_cast<double>(data[e - lo]) * s);
    }
}

void scale_span(const core::Tensor& flat, int64_t lo, int64_t hi, int64_t cols, const std::vector<double>& row_scale) {
    const core::Tensor span = flat.slice(0, lo, hi);
    // A device weight goes through the host: the scaled rows only, copied back as raw bytes.
    const core::Tensor host = span.device() == core::Device::cpu ? span : span.to_device(core::Device::cpu);
    if (host.dtype() == core::DType::f32)
        scale_host(host.data<float>(), lo, hi, cols, row_scale);
    else
        scale_host(host.data<double>(), lo, hi, cols, row_scale);
    if (span.device() != core::Device::cpu) span.copy_from(host);
}

}  // namespace

std::vector<double> qk_clip_group_max(const std::vector<double>& head_max, int64_t n_heads, int64_t n_kv_heads) {
    check_heads(n_heads, n_kv_heads);
    MT_CHECK(static_cast<int64_t>(head_max.size()) == n_heads,
             "QK-clip: {} head maxima for {} query heads",
             head_max.size(),
             n_heads);
    const int64_t per_group = n_heads / n_kv_heads;
    std::vector<double> group(static_cast<size_t>(n_kv_heads), -std::numeric_limits<double>::infinity());
    for (int64_t h = 0; h < n_heads; ++h) {
        double& g = group[static_cast<size_t>(h / per_group)];
        const double s = head_max[static_cast<size_t>(h)];
        // NaN propagates (the group is then left alone, as a broken step's); std::max would drop it.
        g = std::isnan(s) || std::isnan(g) ? std::numeric_limits<double>::quiet_NaN() : std::max(g, s);
    }
    return group;
}

QkClipFactors qk_clip_factors_from_groups(const std::vector<double>& group_max,
                                          int64_t n_heads,
                                          int64_t n_kv_heads,
                                          int64_t head_dim,
                                          double tau,
                                          double alpha) {
    check_heads(n_heads, n_kv_heads);
    MT_CHECK(static_cast<int64_t>(group_max.size()) == n_kv_heads,
             "QK-clip: {} group maxima for {} kv groups",
             group_max.size(),
             n_kv_heads);
    MT_CHECK(head_dim > 0, "QK-clip: head_dim {}", head_dim);
    MT_CHECK(std::isfinite(tau) && tau > 0.0, "QK-clip: tau {} must be positive", tau);
    MT_CHECK(alpha >= 0.0 && alpha <= 1.0, "QK-clip: alpha {} must lie in [0, 1]", alpha);
    const int64_t per_group = n_heads / n_kv_heads;
    QkClipFactors f;
    f.q_row_scale.assign(static_cast<size_t>(n_heads * head_dim), 1.0);
    f.k_row_scale.assign(static_cast<size_t>(n_kv_heads * head_dim), 1.0);
    f.group_eta.assign(static_cast<size_t>(n_kv_heads), 1.0);
    for (int64_t g = 0; g < n_kv_heads; ++g) {
        const double s = group_max[static_cast<size_t>(g)];
        if (!std::isfinite(s) || !(s > tau)) continue;
        const double eta = tau / s;
        // alpha 0.5 gives sqrt(eta) on both sides; alpha 1 (0) gives eta on q (k) and exactly 1 on the other.
        const double q = alpha == 0.5 ? std::sqrt(eta) : std::pow(eta, alpha);
        const double k = alpha == 0.5 ? q : std::pow(eta, 1.0 - alpha);
        f.group_eta[static_cast<size_t>(g)] = eta;
        std::fill_n(f.q_row_scale.begin() + g * per_group * head_dim, per_group * head_dim, q);
        std::fill_n(f.k_row_scale.begin() + g * head_dim, head_dim, k);
        f.heads_clipped += per_group;
        f.groups_clipped += 1;
    }
    f.any = f.groups_clipped > 0;
    return f;
}

QkClipFactors qk_clip_factors(const std::vector<double>& head_max,
                              int64_t n_heads,
                              int64_t n_kv_heads,
                              int64_t head_dim,
                              double tau,
                              double alpha) {
    return qk_clip_factors_from_groups(
        qk_clip_group_max(head_max, n_heads, n_kv_heads), n_heads, n_kv_heads, head_dim, tau, alpha);
}

void qk_clip_scale_rows(const core::Tensor& weight, const std::vector<double>& row_scale) {
    qk_clip_scale_rows_range(weight, row_scale, 0, weight.numel());
}

void qk_clip_scale_rows_range(const core::Tensor& weight,
                              const std::vector<double>& row_scale,
                              int64_t begin,
                              int64_t end) {
    MT_CHECK(
        weight.ndim() == 2, "QK-clip scales the rows of a matrix, not a {} tensor", core::shape_str(weight.shape()));
    MT_CHECK(weight.dtype() == core::DType::f32 || weight.dtype() == core::DType::f64,
             "QK-clip scales f32 or f64 (master) weights, not {}",
             core::dtype_name(weight.dtype()));
    MT_CHECK(weight.is_contiguous(), "QK-clip scales a contiguous weight");
    const int64_t rows = weight.size(0), cols = weight.size(1);
    MT_CHECK(static_cast<int64_t>(row_scale.size()) == rows,
             "QK-clip: {} row factors for a weight of {} rows",
             row_scale.size(),
             rows);
    MT_CHECK(0 <= begin && begin <= end && end <= weight.numel(),
             "QK-clip: element range [{}, {}) of a weight of {} elements",
             begin,
             end,
             weight.numel());
    for (double s : row_scale) MT_CHECK(std::isfinite(s), "QK-clip: row factor {} is not finite", s);
    if (begin == end) return;
    const core::Tensor flat = weight.reshape({weight.numel()});
    // Runs of consecutive rows to scale (a clipped group's rows are contiguous), cut to [begin, end).
    const int64_t last_row = (end - 1) / cols;
    for (int64_t r = begin / cols; r <= last_row;) {
        if (row_scale[static_cast<size_t>(r)] == 1.0) {
            ++r;
            continue;
        }
        int64_t r1 = r + 1;
        while (r1 <= last_row && row_scale[static_cast<size_t>(r1)] != 1.0) ++r1;
        const int64_t lo = std::max(begin, r * cols), hi = std::min(end, r1 * cols);
        scale_span(flat, lo, hi, cols, row_scale);
        r = r1;
    }
}

}  // namespace mt::nn
