// CPU reference of Muon's step and Newton-Schulz (ops/muon.h): the products are single-threaded BLAS calls
// (ops/cpu/blas.h), the matrices of a stack run in parallel, and every sum is in a fixed order, so the result does
// not depend on the thread count.
#include "ops/muon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops::cpu {

namespace {

// x [a_rows, b_cols] (row-major) -> out, orthogonalised (muon.md §1). x is first divided by its Frobenius norm
// plus 1e-7 and worked on as the p x q matrix X (p = min, q = max: transposed when a_rows > b_cols, so that the
// Gram matrix X X^T is the small one), then transposed back into out.
template <typename T>
void orthogonalise(const T* x, T* out, int64_t a_rows, int64_t b_cols, const MuonHyper& h) {
    const bool tall = a_rows > b_cols;
    const int64_t p = tall ? b_cols : a_rows, q = tall ? a_rows : b_cols;
    double sq = 0.0;
    for (int64_t i = 0; i < p * q; ++i) sq += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    const T inv = static_cast<T>(1.0 / (std::sqrt(sq) + 1e-7));
    std::vector<T> cur(static_cast<size_t>(p * q)), next(cur.size()), gram(static_cast<size_t>(p * p)),
        poly(gram.size());
    for (int64_t i = 0; i < a_rows; ++i)
        for (int64_t j = 0; j < b_cols; ++j)
            cur[static_cast<size_t>(tall ? j * q + i : i * q + j)] = x[i * b_cols + j] * inv;
    for (int k = 0; k < h.total_steps(); ++k) {
        double a = 0, b = 0, c = 0;
        h.coeffs(k, a, b, c);
        // gram = X X^T; poly = b gram + c gram gram; next = a X + poly X
        gemm(false, true, p, p, q, T(1), cur.data(), q, cur.data(), q, T(0), gram.data(), p);
        std::copy(gram.begin(), gram.end(), poly.begin());
        gemm(false,
             false,
             p,
             p,
             p,
             static_cast<T>(c),
             gram.data(),
             p,
             gram.data(),
             p,
             static_cast<T>(b),
             poly.data(),
             p);
        std::copy(cur.begin(), cur.end(), next.begin());
        gemm(false, false, p, q, p, T(1), poly.data(), p, cur.data(), q, static_cast<T>(a), next.data(), q);
        cur.swap(next);
    }
    for (int64_t i = 0; i < a_rows; ++i)
        for (int64_t j = 0; j < b_cols; ++j)
            out[i * b_cols + j] = cur[static_cast<size_t>(tall ? j * q + i : i * q + j)];
}

template <typename T>
void newton_schulz(const T* x, T* out, int64_t stack, int64_t a_rows, int64_t b_cols, const MuonHyper& h) {
    blas_use_one_thread();
    const int64_t n = a_rows * b_cols;
#pragma omp parallel for schedule(dynamic, 1) if (stack > 1)
    for (int64_t e = 0; e < stack; ++e) orthogonalise(x + e * n, out + e * n, a_rows, b_cols, h);
}

// The momentum update of one matrix's n elements and the direction Newton-Schulz orthogonalises (muon_step and
// muon_momentum: one definition, the same bits).
template <typename T>
void momentum_direction(const T* g, T* mm, T* nest, int64_t n, T mu, T s, bool nesterov) {
    for (int64_t i = 0; i < n; ++i) {
        const T gi = g[i] * s;
        mm[i] = mu * mm[i] + gi;
        nest[i] = nesterov ? gi + mu * mm[i] : mm[i];
    }
}

// w = decay w - step o over one matrix's n elements; returns the squared change (muon_step and muon_apply).
template <typename T>
double apply_update(T* w, const T* o, int64_t n, T decay, T step) {
    double sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const T before = w[i];
        w[i] = decay * w[i] - step * o[i];
        const double d = static_cast<double>(w[i]) - static_cast<double>(before);
        sq += d * d;
    }
    return sq;
}

void add_change(const std::vector<double>& change, double* update_sq, bool per_matrix) {
    if (update_sq != nullptr && per_matrix)
        for (size_t e = 0; e < change.size(); ++e) update_sq[e] += change[e];
    else if (update_sq != nullptr)
        for (double c : change) *update_sq += c;  // in matrix order: the same sum for any thread count
}

template <typename T>
void muon_step(T* param,
               const T* grad,
               T* m,
               int64_t stack,
               int64_t a_rows,
               int64_t b_cols,
               const MuonHyper& h,
               double grad_scale,
               double* update_sq,
               bool per_matrix,
               double* n_norm) {
    blas_use_one_thread();
    const int64_t n = a_rows * b_cols;
    const T mu = static_cast<T>(h.momentum), s = static_cast<T>(grad_scale);
    const T decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
    const T step = static_cast<T>(h.lr * h.scale_factor * std::sqrt(static_cast<double>(std::max(a_rows, b_cols))));
    std::vector<double> change(static_cast<size_t>(stack), 0.0);
#pragma omp parallel for schedule(dynamic, 1) if (stack > 1)
    for (int64_t e = 0; e < stack; ++e) {
        T* w = param + e * n;
        T* mm = m + e * n;
        const T* g = grad + e * n;
        std::vector<T> nest(static_cast<size_t>(n)), o(static_cast<size_t>(n));
        momentum_direction(g, mm, nest.data(), n, mu, s, h.nesterov);
        if (n_norm != nullptr) {
            double nsq = 0.0;
            for (int64_t i = 0; i < n; ++i)
                nsq += static_cast<double>(nest[static_cast<size_t>(i)]) *
                       static_cast<double>(nest[static_cast<size_t>(i)]);
            n_norm[e] = std::sqrt(nsq);
        }
        orthogonalise(nest.data(), o.data(), a_rows, b_cols, h);
        change[static_cast<size_t>(e)] = apply_update(w, o.data(), n, decay, step);
    }
    add_change(change, update_sq, per_matrix);
}

template <typename T>
void momentum_stack(const T* grad, T* m, T* n, int64_t stack, int64_t per, const MuonHyper& h, double grad_scale) {
    const T mu = static_cast<T>(h.momentum), s = static_cast<T>(grad_scale);
#pragma omp parallel for schedule(static) if (stack > 1)
    for (int64_t e = 0; e < stack; ++e)
        momentum_direction(grad + e * per, m + e * per, n + e * per, per, mu, s, h.nesterov);
}

template <typename T>
void apply_stack(
    T* param, const T* o, int64_t stack, int64_t per, double decay, double step, double* update_sq, bool per_matrix) {
    std::vector<double> change(static_cast<size_t>(stack), 0.0);
#pragma omp parallel for schedule(static) if (stack > 1)
    for (int64_t e = 0; e < stack; ++e)
        change[static_cast<size_t>(e)] =
            apply_update(param + e * per, o + e * per, per, static_cast<T>(decay), static_cast<T>(step));
    add_change(change, update_sq, per_matrix);
}

}  // namespace

// The CPU kernels (registered in the op registry): the CPU dtypes, then the float dispatch.
void muon_step(const Tensor& param,
               const Tensor& grad,
               const Tensor& m,
               const MuonHyper& hyper,
               double grad_scale,
               const Tensor& update_sq,
               const Tensor& param_copy,
               const Tensor& n_norm) {
    constexpr std::string_view op = "muon_step";
    check_float_arg(param, op, "param", 3);
    check_dtype_as(grad, param, op, "grad", "param");
    check_dtype_as(m, param, op, "m", "param");
    double* sq = update_sq.defined() ? update_sq.data<double>() : nullptr;
    MT_DISPATCH_FLOAT(param.dtype(),
                      op,
                      muon_step(param.data<scalar_t>(),
                                grad.data<scalar_t>(),
                                m.data<scalar_t>(),
                                param.size(0),
                                param.size(1),
                                param.size(2),
                                hyper,
                                grad_scale,
                                sq,
                                update_sq.defined() && update_sq.size(0) > 1,
                                n_norm.defined() ? n_norm.data<double>() : nullptr));
    if (param_copy.defined()) param_copy.copy_from(param);
}
MT_REGISTER_KERNEL(muon_step, cpu, muon_step, ::mt::ops::float_dtypes);

void muon_momentum(const Tensor& grad, const Tensor& m, const Tensor& n, const MuonHyper& hyper, double grad_scale) {
    constexpr std::string_view op = "muon_momentum";
    check_float_arg(m, op, "m", 3);
    check_dtype_as(grad, m, op, "grad", "m");
    MT_DISPATCH_FLOAT(m.dtype(),
                      op,
                      momentum_stack(grad.data<scalar_t>(),
                                     m.data<scalar_t>(),
                                     n.data<scalar_t>(),
                                     m.size(0),
                                     m.size(1) * m.size(2),
                                     hyper,
                                     grad_scale));
}
MT_REGISTER_KERNEL(muon_momentum, cpu, muon_momentum, ::mt::ops::float_dtypes);

void muon_apply(const Tensor& param,
                const Tensor& o,
                double decay,
                double step,
                const Tensor& update_sq,
                const Tensor& param_copy) {
    constexpr std::string_view op = "muon_apply";
    check_float_arg(param, op, "param", 3);
    check_dtype_as(o, param, op, "o", "param");
    MT_DISPATCH_FLOAT(param.dtype(),
                      op,
                      apply_stack(param.data<scalar_t>(),
                                  o.data<scalar_t>(),
                                  param.size(0),
                                  param.size(1) * param.size(2),
                                  decay,
                                  step,
                                  update_sq.defined() ? update_sq.data<double>() : nullptr,
                                  update_sq.defined() && update_sq.size(0) > 1));
    if (param_copy.defined()) param_copy.copy_from(param);
}
MT_REGISTER_KERNEL(muon_apply, cpu, muon_apply, ::mt::ops::float_dtypes);

void newton_schulz(const Tensor& x, const Tensor& out, const MuonHyper& hyper) {
    constexpr std::string_view op = "newton_schulz";
    check_float_arg(x, op, "x", 3);
    check_dtype_as(out, x, op, "out", "x");
    MT_DISPATCH_FLOAT(
        x.dtype(), op, newton_schulz(x.data<scalar_t>(), out.data<scalar_t>(), x.size(0), x.size(1), x.size(2), hyper));
}
MT_REGISTER_KERNEL(newton_schulz, cpu, newton_schulz, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
