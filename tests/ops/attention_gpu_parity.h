// Helpers of the GPU attention parity tests that compare against the CPU reference (the key-prefix and the
// bidirectional suites): host copies in f64, NaN-filled outputs (an element a kernel never writes fails the
// comparison), the printed rho check, the forward and backward of one case, and a scope with core::exec().deterministic
// off.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/exec.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "support/rho.h"

namespace mt::ops::test::attention_gpu {

inline core::Tensor host64(const core::Tensor& x) {
    return x.to_device(core::Device::cpu).to(core::DType::f64);
}

inline core::Tensor nan_cuda(const core::Shape& shape, core::DType dtype) {
    const core::Tensor x = core::Tensor::zeros(shape, dtype, core::Device::cuda);
    x.fill(std::nan(""));
    return x;
}

inline void expect_rho(
    const std::string& name, const char* what, const core::Tensor& got, const core::Tensor& ref, double budget) {
    const double r = mt::testing::rho(host64(got), host64(ref));
    std::printf("[ GPU PARITY ] %s %s: rho %.3e (budget %.0e)\n", name.c_str(), what, r, budget);
    EXPECT_LE(r, budget) << name << " " << what;  // NaN (an element never written) fails too
}

// Forward and backward on fresh outputs (NaN-filled on the GPU): out, lse, dq, dk, dv. Both write the kernels they
// ran to options.chosen, except that the forward writes to fwd_chosen instead when it is given.
inline std::vector<core::Tensor> run_fwd_bwd(const core::Tensor& q,
                                             const core::Tensor& k,
                                             const core::Tensor& v,
                                             const core::Tensor& dout,
                                             const AttentionMask& mask,
                                             AttentionOptions options,
                                             std::string* fwd_chosen = nullptr) {
    const bool cuda = q.device() == core::Device::cuda;
    auto make = [&](const core::Shape& shape, core::DType dtype) {
        return cuda ? nan_cuda(shape, dtype) : core::Tensor::zeros(shape, dtype);
    };
    const core::Shape stats = {q.size(0), q.size(2), q.size(1)};
    std::vector<core::Tensor> r = {make(q.shape(), q.dtype()),
                                   make(stats, cuda ? core::DType::f32 : q.dtype()),
                                   make(q.shape(), q.dtype()),
                                   make(k.shape(), k.dtype()),
                                   make(k.shape(), k.dtype())};
    AttentionOptions fwd_options = options;
    if (fwd_chosen != nullptr) fwd_options.chosen = fwd_chosen;
    attention_fwd(q, k, v, r[0], r[1], fwd_options, mask);
    attention_bwd(q, k, v, r[0], r[1], dout, r[2], r[3], r[4], options, mask);
    return r;
}

// Runs fn with core::exec().deterministic off (the fast wgmma backward where it applies).
template <typename Fn>
void nondeterministic(Fn fn) {
    core::ExecCtx ctx = core::exec();
    ctx.deterministic = false;
    const core::ExecScope scope(ctx);
    fn();
}

}  // namespace mt::ops::test::attention_gpu
