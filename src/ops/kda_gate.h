// The KDA gate (kda.md §3): per-key-channel log decay g from the gate input u, per value head h.
//   lower_bound (default):  g = l * sigmoid(a_h (u + b)),  a_h = exp(A_log_h),  l in [-5, 0): g in (l, 0)
//   softplus (Kimi Linear):  g = -a_h * softplus(u + b):  g in (-inf, 0)
//   u, g:   [N, HV, K] f32|f64 (N = B * T tokens)
//   a_log:  [HV], or undefined when use_a_log is false (a = 1)
//   bias:   [HV, K] (dt_bias)
// Saves nothing beyond its inputs. _bwd: du written (=); da_log and dbias accumulate (+=, parameter grads), summed
// over tokens in a fixed order.
#pragma once

#include "ops/op_common.h"

namespace mt::ops {

enum class KdaGateKind { lower_bound, softplus };

struct KdaGateOptions {
    KdaGateKind kind = KdaGateKind::lower_bound;
    double lower_bound = -5.0;  // l, lower_bound kind only; must be in [-5, 0)
    bool use_a_log = true;      // false: a = 1 and a_log is undefined
};

void kda_gate_fwd(
    const Tensor& u, const Tensor& a_log, const Tensor& bias, const Tensor& g, const KdaGateOptions& options = {});
void kda_gate_bwd(const Tensor& u,
                  const Tensor& a_log,
                  const Tensor& bias,
                  const Tensor& dg,
                  const Tensor& du,
                  const Tensor& da_log,
                  const Tensor& dbias,
                  const KdaGateOptions& options = {});

}  // namespace mt::ops
