// CUDA-only dtype paths of the Block AttnRes mix (ops/attnres_mix.h) that the harness's parity cases do not take
// (OpParity.attnres_mix_*, label gpu, skipped without a GPU): d_sources in the sources' own dtype (the parity runs
// give bf16 and f16 sources f32 buffers) and query/key_gain of another dtype than the sources. Both are checked
// against the same GPU op on the harness's path: the bf16/f16 d_sources equal the f32 ones up to their rounding, and
// a query in f32 holding bf16-exact values gives the same bits as the same query in bf16.
#include <gtest/gtest.h>

#include <tuple>

#include "op_harness.h"
#include "ops/attnres_mix.h"

namespace mt::ops::test {
namespace {

using core::Device;

// m sources [n, c] of dtype t on the device, query and gain of dtype tq, both directions twice: the reference with f32
// d_sources and a query of the sources' dtype, and the variant. The values are drawn once and rounded to t, so every
// run sees the same numbers.
void dtype_paths(int64_t m, int64_t n, int64_t c, DType t) {
    const std::string name = fmt::format("attnres_mix_dtypes_m{}_n{}_c{}_{}", m, n, c, core::dtype_name(t));
    const uint64_t seed = op_seed(name);
    auto dev = [&](const Tensor& x, DType d) { return x.to(t).to(d).to_device(Device::cuda); };
    std::vector<Tensor> src, init;
    for (int64_t j = 0; j < m; ++j) {
        src.push_back(dev(op_randn({n, c}, seed, static_cast<uint64_t>(j), 0.0, 1.0 + 0.3 * j), t));
        init.push_back(op_randn({n, c}, seed, 50 + static_cast<uint64_t>(j)));  // the gradients' prior contents
    }
    const Tensor query64 = op_randn({c}, seed, 100, 0.0, 0.5), gain64 = op_randn({c}, seed, 101, 1.0, 0.2);
    const Tensor dh = dev(op_randn({n, c}, seed, 102), t);
    struct Result {
        Tensor h, alpha, dquery, dgain;
        std::vector<Tensor> dv;
    };
    auto run = [&](DType query_dtype, DType dv_dtype) {
        const Tensor query = dev(query64, query_dtype), gain = dev(gain64, query_dtype);
        Result r{Tensor::zeros({n, c}, t, Device::cuda),
                 Tensor::zeros({n, m}, DType::f32, Device::cuda),
                 Tensor::zeros({c}, DType::f32, Device::cuda),
                 Tensor::zeros({c}, DType::f32, Device::cuda),
                 {}};
        for (const Tensor& x : init) r.dv.push_back(dev(x, dv_dtype));
        attnres_mix_fwd(src, query, gain, 1e-6, r.h, r.alpha, 0.2);
        attnres_mix_bwd(src, query, gain, 1e-6, r.alpha, dh, r.dv, r.dquery, r.dgain, 0.2);
        return r;
    };
    const Result ref = run(t, DType::f32), own = run(t, t), wide = run(DType::f32, DType::f32);
    for (int64_t j = 0; j < m; ++j)
        op_expect_parity(name, fmt::format("d_sources[{}] in {}", j, core::dtype_name(t)), own.dv[j], ref.dv[j], 1e-2);
    EXPECT_TRUE(op_same_bytes(own.dquery, ref.dquery) && op_same_bytes(own.dgain, ref.dgain))
        << name << ": dquery and dkey_gain depend on the d_sources dtype";
    for (const auto& [got, want, what] : {std::tuple{&wide.h, &ref.h, "h"},
                                          std::tuple{&wide.alpha, &ref.alpha, "alpha"},
                                          std::tuple{&wide.dquery, &ref.dquery, "dquery"},
                                          std::tuple{&wide.dgain, &ref.dgain, "dkey_gain"}})
        EXPECT_TRUE(op_same_bytes(*got, *want)) << name << ": " << what << " differs with an f32 query";
    for (int64_t j = 0; j < m; ++j)
        EXPECT_TRUE(op_same_bytes(wide.dv[j], ref.dv[j])) << name << ": d_sources[" << j << "] differs";
}

[[maybe_unused]] const bool kRegistered = [] {
    // Fixed m (2, 5) and generic m (9) on the vector path, and the scalar path (C = 37).
    for (auto [m, n, c] :
         {std::tuple{2, 33, 1536}, std::tuple{5, 70, 1536}, std::tuple{9, 12, 64}, std::tuple{3, 10, 37}})
        for (DType t : {DType::bf16, DType::f16})
            op_register_parity_check("attnres_mix",
                                     fmt::format("attnres_mix_dtypes_m{}_n{}_c{}_{}", m, n, c, core::dtype_name(t)),
                                     [=] { dtype_paths(m, n, c, t); });
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
