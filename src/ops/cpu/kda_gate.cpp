// CPU reference of the KDA gate (ops/kda_gate.h). One task per value head walks every token in order, so the
// parameter gradients (sums over tokens) have a fixed order for any thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/kda_kernels.h"
#include "ops/cpu/kernels.h"

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
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t x = 0; x < k; ++x) {
                const int64_t i = (r * hv + h) * k + x;
                const T z = u[i] + bias[h * k + x];
                g[i] = lower_bound ? lb * sigmoid(a * z) : -a * softplus(z);
            }
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
        std::vector<T> db(static_cast<size_t>(k), T(0));
        T da = 0;
        for (int64_t r = 0; r < n; ++r) {
            for (int64_t x = 0; x < k; ++x) {
                const int64_t i = (r * hv + h) * k + x;
                const T z = u[i] + bias[h * k + x];
                T dz, dlog_a;
                if (lower_bound) {
                    const T s = sigmoid(a * z), ds = lb * s * (T(1) - s);
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

}  // namespace mt::ops::cpu
