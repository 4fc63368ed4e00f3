// CPU reference of the KDA gate (ops/kda_gate.h). One task per value head walks every token in order, so the
// parameter gradients (sums over tokens) have a fixed order for any thread count.
#include "ops/kda_gate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/threading.h"
#include "ops/cpu/vec_math.h"
#include "ops/registry.h"

namespace mt::ops::cpu {
namespace {

template <typename T>
T sigmoid(T x) {
    return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
}

// log(1 + e^x) without overflow.
template <typename T>
T softplus(T x) {
    return std::max(x, T(0)) + std::log1p(std::exp(-std::fabs(x)));
}

}  // namespace

template <typename T>
void kda_gate_fwd(
    const T* u, const T* a_log, const T* bias, T* g, int64_t n, int64_t hv, int64_t k, bool lower_bound, double l) {
#pragma omp parallel for schedule(static) if (n * hv * k >= kParallelMinWork)
    for (int64_t h = 0; h < hv; ++h) {
        const T a = a_log ? std::exp(a_log[h]) : T(1), lb = static_cast<T>(l);
        std::vector<T> e(static_cast<size_t>(k));  // lower_bound: exp(-a z) of one row, by the vectorized exp
        for (int64_t r = 0; r < n; ++r) {
            const int64_t i0 = (r * hv + h) * k;
            if (lower_bound) {  // sigmoid(a z) = 1 / (1 + exp(-a z))
                for (int64_t x = 0; x < k; ++x) e[x] = u[i0 + x] + bias[h * k + x];
                exp_affine(e.data(), e.data(), k, -a, T(0));
                for (int64_t x = 0; x < k; ++x) g[i0 + x] = lb / (T(1) + e[x]);
                continue;
            }
            for (int64_t x = 0; x < k; ++x) g[i0 + x] = -a * softplus(u[i0 + x] + bias[h * k + x]);
        }
    }
}

// lower_bound: s = sigmoid(a z), dg/du = dg/db = l a s (1 - s), dg/dA_log = l s (1 - s) a z
// softplus:    dg/du = dg/db = -a sigmoid(z), dg/dA_log = g = -a softplus(z)
template <typename T>
void kda_gate_bwd(const T* u,
                  const T* a_log,
                  const T* bias,
                  const T* dg,
                  T* du,
                  T* da_log,
                  T* dbias,
                  int64_t n,
                  int64_t hv,
                  int64_t k,
                  bool lower_bound,
                  double l) {
#pragma omp parallel for schedule(static) if (n * hv * k >= kParallelMinWork)
    for (int64_t h = 0; h < hv; ++h) {
        const T a = a_log ? std::exp(a_log[h]) : T(1), lb = static_cast<T>(l);
        std::vector<T> db(static_cast<size_t>(k), T(0)), e(static_cast<size_t>(k));
        T da = 0;
        for (int64_t r = 0; r < n; ++r) {
            if (lower_bound) {  // exp(-a z) of the row, by the vectorized exp
                for (int64_t x = 0; x < k; ++x) e[x] = u[(r * hv + h) * k + x] + bias[h * k + x];
                exp_affine(e.data(), e.data(), k, -a, T(0));
            }
            for (int64_t x = 0; x < k; ++x) {
                const int64_t i = (r * hv + h) * k + x;
                const T z = u[i] + bias[h * k + x];
                T dz, dlog_a;
                if (lower_bound) {
                    const T s = T(1) / (T(1) + e[x]), ds = lb * s * (T(1) - s);
                    dz = ds * a;
                    dlog_a = ds * a * z;
                } else {
                    dz = -a * sigmoid(z);
                    dlog_a = -a * softplus(z);
                }
                du[i] = dg[i] * dz;
                db[x] += dg[i] * dz;
                da += dg[i] * dlog_a;
            }
        }
        for (int64_t x = 0; x < k; ++x) dbias[h * k + x] += db[x];
        if (da_log) da_log[h] += da;
    }
}

template void kda_gate_fwd<float>(
    const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, bool, double);
template void kda_gate_fwd<double>(
    const double*, const double*, const double*, double*, int64_t, int64_t, int64_t, bool, double);
template void kda_gate_bwd<float>(const float*,
                                  const float*,
                                  const float*,
                                  const float*,
                                  float*,
                                  float*,
                                  float*,
                                  int64_t,
                                  int64_t,
                                  int64_t,
                                  bool,
                                  double);
template void kda_gate_bwd<double>(const double*,
                                   const double*,
                                   const double*,
                                   const double*,
                                   double*,
                                   double*,
                                   double*,
                                   int64_t,
                                   int64_t,
                                   int64_t,
                                   bool,
                                   double);

namespace {

void check_like_u(const Tensor& t, const Tensor& u, std::string_view op, const char* name) {
    check_float_arg(t, op, name, 3);
    check_shape(t, u.shape(), op, name);
    check_dtype_as(t, u, op, name, "u");
}

void check_gate(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const KdaGateOptions& options, std::string_view op) {
    check_float_arg(u, op, "u", 3);
    const int64_t hv = u.size(1), k = u.size(2);
    if (options.use_a_log) {
        MT_CHECK(a_log.defined(), "{}: a_log is undefined but use_a_log is set", op);
        check_float_arg(a_log, op, "a_log", 1);
        check_shape(a_log, {hv}, op, "a_log");
        check_dtype_as(a_log, u, op, "a_log", "u");
    } else {
        MT_CHECK(!a_log.defined(), "{}: a_log is given but use_a_log is false", op);
    }
    check_float_arg(bias, op, "bias", 2);
    check_shape(bias, {hv, k}, op, "bias");
    check_dtype_as(bias, u, op, "bias", "u");
    if (options.kind == KdaGateKind::lower_bound)
        MT_CHECK(options.lower_bound >= -5.0 && options.lower_bound < 0.0,
                 "{}: lower_bound = {} is outside [-5, 0)",
                 op,
                 options.lower_bound);
}

}  // namespace

// The CPU kernel of ops::kda_gate_fwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void kda_gate_fwd(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const Tensor& g, const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_fwd";
    const bool lb = options.kind == KdaGateKind::lower_bound;
    check_gate(u, a_log, bias, options, op);
    check_like_u(g, u, op, "g");
    MT_DISPATCH_FLOAT(u.dtype(),
                      op,
                      cpu::kda_gate_fwd(u.data<scalar_t>(),
                                        a_log.defined() ? a_log.data<scalar_t>() : nullptr,
                                        bias.data<scalar_t>(),
                                        g.data<scalar_t>(),
                                        u.size(0),
                                        u.size(1),
                                        u.size(2),
                                        lb,
                                        options.lower_bound));
}
MT_REGISTER_KERNEL(kda_gate_fwd, cpu, kda_gate_fwd, ::mt::ops::float_dtypes);

// The CPU kernel of ops::kda_gate_bwd (registered in the op registry): the CPU dtypes, then the float dispatch.
void kda_gate_bwd(const Tensor& u,
                  const Tensor& a_log,
                  const Tensor& bias,
                  const Tensor& dg,
                  const Tensor& du,
                  const Tensor& da_log,
                  const Tensor& dbias,
                  const KdaGateOptions& options) {
    constexpr std::string_view op = "kda_gate_bwd";
    const bool lb = options.kind == KdaGateKind::lower_bound;
    check_gate(u, a_log, bias, options, op);
    check_like_u(dg, u, op, "dg");
    check_like_u(du, u, op, "du");
    MT_CHECK(da_log.defined() == a_log.defined(), "{}: da_log must be given exactly when a_log is", op);
    if (da_log.defined()) {
        check_float_arg(da_log, op, "da_log", 1);
        check_shape(da_log, a_log.shape(), op, "da_log");
        check_dtype_as(da_log, u, op, "da_log", "u");
    }
    check_float_arg(dbias, op, "dbias", 2);
    check_shape(dbias, bias.shape(), op, "dbias");
    check_dtype_as(dbias, u, op, "dbias", "u");
    MT_DISPATCH_FLOAT(u.dtype(),
                      op,
                      cpu::kda_gate_bwd(u.data<scalar_t>(),
                                        a_log.defined() ? a_log.data<scalar_t>() : nullptr,
                                        bias.data<scalar_t>(),
                                        dg.data<scalar_t>(),
                                        du.data<scalar_t>(),
                                        da_log.defined() ? da_log.data<scalar_t>() : nullptr,
                                        dbias.data<scalar_t>(),
                                        u.size(0),
                                        u.size(1),
                                        u.size(2),
                                        lb,
                                        options.lower_bound));
}
MT_REGISTER_KERNEL(kda_gate_bwd, cpu, kda_gate_bwd, ::mt::ops::float_dtypes);

}  // namespace mt::ops::cpu
