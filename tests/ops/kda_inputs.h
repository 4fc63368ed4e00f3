// Helpers of the KDA op tests: parity on or off, states in f32 on the device, and seeded KDA op inputs:
// L2-normalised q (scaled by K^-1/2) and k, normal v, beta in (0.05, 0.95), an initial state, and log decays g from
// one of several gate regimes.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "op_harness.h"
#include "ops/kda.h"

namespace mt::ops::test {

// Turns off every device dtype of a case's parity mode (an op without a CUDA path), whichever dtypes this
// version of the harness has.
template <typename Options>
void parity_dtypes_off(Options& p) {
    p.bf16 = false;
    p.f32 = false;
    if constexpr (requires { p.f16; }) p.f16 = false;
}
inline void op_parity_off(OpCase& c, const std::string& op) {
    parity_dtypes_off(c.parity);
    c.parity.budget_reason = op + " has no CUDA path yet (issue 4, CPU part only)";
}
// Turns on every device dtype of a case's parity mode with the given budgets and reason.
inline void op_parity_on(OpCase& c, double bf16_budget, double f32_budget, const std::string& reason) {
    c.parity.bf16 = true;
    c.parity.f32 = true;
    if constexpr (requires { c.parity.f16; }) c.parity.f16 = true;
    c.parity.bf16_budget = bf16_budget;
    c.parity.f32_budget = f32_budget;
    c.parity.budget_reason = reason;
}

// KDA states are f32 on the device whatever the activation dtype (kda.md §2): a device state of another dtype is
// converted to f32; CPU tensors and f32 tensors are returned as they are.
inline Tensor kda_state_f32(const Tensor& t) {
    if (!t.defined() || t.device() == core::Device::cpu || t.dtype() == DType::f32) return t;
    return t.to(DType::f32);
}
// A zero state [B, HV, K, V] for an op whose activations are like q: f32 on the device, q's dtype on the CPU.
inline Tensor kda_state_like(const Tensor& q, const Shape& shape) {
    if (q.device() == core::Device::cpu) return op_like(q, shape);
    return Tensor::zeros(shape, DType::f32, q.device());
}

// The log-decay regimes of the tests (kda.md §8.1).
enum class KdaGateRegime {
    bounded,    // g = -5 sigmoid(z), z ~ N(0, 2): the lower-bounded gate, values over all of (-5, 0)
    floor,      // g = -5 everywhere: the worst case of the bounded gate
    near_zero,  // g in (-1e-3, 0): almost no decay
    softplus,   // g = -softplus(z) * a, a up to 16, values down to about -160: the unbounded gate
};

struct KdaShape {
    int64_t b = 1, t = 1, h = 1, hv = 1, k = 4, v = 4;
    double q_norm = 0.0;  // norm of q's rows; 0: 1 / sqrt(K), the layer's scale
};

struct KdaInputs {
    Tensor q, k, v, g, beta, s0;  // f64; s0 undefined when not asked for
};

// Rows of x [B, T, H, K] normalised to norm `scale`.
inline void kda_normalize_rows(const Tensor& x, double scale) {
    const int64_t kd = x.size(3), rows = x.numel() / kd;
    for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < kd; ++i)
            ss += core::tensor_get_flat(x, r * kd + i) * core::tensor_get_flat(x, r * kd + i);
        const double f = scale / std::sqrt(ss + 1e-6);
        for (int64_t i = 0; i < kd; ++i) core::tensor_set_flat(x, r * kd + i, core::tensor_get_flat(x, r * kd + i) * f);
    }
}

inline Tensor kda_gate_values(const KdaShape& s, KdaGateRegime regime, uint64_t seed) {
    const Tensor z = op_randn({s.b, s.t, s.hv, s.k}, seed, 3, 0.0, 2.0);
    const Tensor u = op_uniform({s.b, s.t, s.hv, s.k}, seed, 4, 0.0, 1.0);
    for (int64_t i = 0; i < z.numel(); ++i) {
        const double x = core::tensor_get_flat(z, i), w = core::tensor_get_flat(u, i);
        double g = 0;
        switch (regime) {
            case KdaGateRegime::bounded:
                g = -5.0 / (1.0 + std::exp(-x));
                break;
            case KdaGateRegime::floor:
                g = -5.0;
                break;
            case KdaGateRegime::near_zero:
                g = -1e-3 * w - 1e-6;
                break;
            case KdaGateRegime::softplus: {
                const double a = std::exp(std::log(16.0) * w);  // a in [1, 16)
                g = -a * (std::max(x + 2.0, 0.0) + std::log1p(std::exp(-std::fabs(x + 2.0))));
                g = std::max(g, -160.0);
                break;
            }
        }
        core::tensor_set_flat(z, i, g);
    }
    return z;
}

inline KdaInputs kda_make_inputs(const KdaShape& s, KdaGateRegime regime, bool with_s0, uint64_t seed) {
    KdaInputs in;
    in.q = op_randn({s.b, s.t, s.h, s.k}, seed, 0);
    in.k = op_randn({s.b, s.t, s.h, s.k}, seed, 1);
    kda_normalize_rows(in.q, s.q_norm > 0.0 ? s.q_norm : 1.0 / std::sqrt(static_cast<double>(s.k)));
    kda_normalize_rows(in.k, 1.0);
    in.v = op_randn({s.b, s.t, s.hv, s.v}, seed, 2);
    in.g = kda_gate_values(s, regime, seed);
    in.beta = op_uniform({s.b, s.t, s.hv}, seed, 5, 0.05, 0.95);
    if (with_s0) in.s0 = op_randn({s.b, s.hv, s.k, s.v}, seed, 6, 0.0, 0.5);
    return in;
}

// Outputs and gradients of one KDA evaluation (forward and backward with fixed random dout, dst).
struct KdaResult {
    Tensor out, st, dq, dk, dv, dg, dbeta, ds0;
};

// Runs kda_fwd and kda_bwd on the inputs converted to `dtype`; dout and dst are seeded normals.
inline KdaResult kda_run(const KdaInputs& in, const KdaOptions& options, DType dtype, uint64_t seed) {
    auto cv = [dtype](const Tensor& t) { return t.defined() ? t.to(dtype) : Tensor(); };
    const Tensor q = cv(in.q), k = cv(in.k), v = cv(in.v), g = cv(in.g), beta = cv(in.beta), s0 = cv(in.s0);
    const int64_t b = q.size(0), hv = v.size(2), kd = q.size(3), vd = v.size(3);
    KdaResult r;
    r.out = op_like(v);
    r.st = Tensor::zeros({b, hv, kd, vd}, dtype);
    kda_fwd(q, k, v, g, beta, s0, r.out, r.st, options);
    const Tensor dout = op_randn(v.shape(), seed, 10).to(dtype), dst = op_randn(r.st.shape(), seed, 11).to(dtype);
    r.dq = op_like(q);
    r.dk = op_like(k);
    r.dv = op_like(v);
    r.dg = op_like(g);
    r.dbeta = op_like(beta);
    if (s0.defined()) r.ds0 = op_like(s0);
    kda_bwd(q, k, v, g, beta, s0, dout, dst, r.dq, r.dk, r.dv, r.dg, r.dbeta, r.ds0, options);
    return r;
}

// Which optional states a run passes: s0 (and so wants ds0), st and dst.
struct KdaUse {
    bool s0 = true, st = true, dst = true;
};

// kda_fwd and kda_bwd in the inputs' own dtype and device (f64 on the CPU from kda_make_inputs), passing only the
// states `use` names; dout and dst are seeded normals. `chosen` (optional) gets the forward's KdaOptions::chosen.
inline KdaResult kda_run_use(
    const KdaInputs& in, KdaOptions options, KdaUse use, uint64_t seed, std::string* chosen = nullptr) {
    const int64_t b = in.q.size(0), hv = in.v.size(2), kd = in.q.size(3), vd = in.v.size(3);
    const Tensor s0 = use.s0 ? in.s0 : Tensor();
    KdaResult r;
    r.out = op_like(in.v);
    if (use.st) r.st = op_like(in.v, {b, hv, kd, vd});
    options.chosen = chosen;
    kda_fwd(in.q, in.k, in.v, in.g, in.beta, s0, r.out, r.st, options);
    options.chosen = nullptr;
    const Tensor dout = op_randn(in.v.shape(), seed, 10);
    const Tensor dst = use.dst ? op_randn({b, hv, kd, vd}, seed, 11) : Tensor();
    r.dq = op_like(in.q);
    r.dk = op_like(in.k);
    r.dv = op_like(in.v);
    r.dg = op_like(in.g);
    r.dbeta = op_like(in.beta);
    if (use.s0) r.ds0 = op_like(in.s0);
    kda_bwd(in.q, in.k, in.v, in.g, in.beta, s0, dout, dst, r.dq, r.dk, r.dv, r.dg, r.dbeta, r.ds0, options);
    return r;
}

// (name, tensor) pairs of a result's defined tensors, for comparisons.
inline std::vector<std::pair<std::string, Tensor>> kda_result_tensors(const KdaResult& r) {
    std::vector<std::pair<std::string, Tensor>> all = {{"out", r.out}};
    if (r.st.defined()) all.push_back({"st", r.st});
    for (const auto& [name, t] :
         {std::pair{"dq", r.dq}, {"dk", r.dk}, {"dv", r.dv}, {"dg", r.dg}, {"dbeta", r.dbeta}, {"ds0", r.ds0}})
        if (t.defined()) all.push_back({name, t});
    return all;
}

// True when every element is finite.
inline bool kda_all_finite(const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i)
        if (!std::isfinite(core::tensor_get_flat(t, i))) return false;
    return true;
}

}  // namespace mt::ops::test
