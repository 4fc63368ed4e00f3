// Sliding-window attention with global tokens and a sink logit (long_context.md §2, §10 test 1): attention_fwd with
// AttentionMask{doc_start, window} followed by attention_global_fwd against a dense reference that writes the mask
// out explicitly (f64, rho <= 1e-12) over w in {1, 7, 64, n}, g in {0, 1, 4}, the sink on and off, with and without
// packed documents; w = n and g = 0 equal full causal attention; the composed backward against central finite
// differences. The op harness cases (attention_global_*) add gradient checks and the CUDA parity of both ops, and the
// GpuAttentionMask tests run every CUDA kernel family with a document map and a window against the CPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_gpu_here.h"
#include "core/backend.h"
#include "core/exec.h"
#include "ops/attention.h"
#include "ops/attention_global.h"
#include "ops/op_harness.h"
#include "support/documents.h"
#include "support/finite_differences.h"
#include "support/rho.h"

namespace mt::ops::test {
namespace {

struct Problem {
    Tensor q, k, v, kg, vg, sink, doc_start;  // kg, vg, sink, doc_start may be undefined
    int64_t window = 0;
};

// starts of row 0: several documents, one of one token; row 1: one document.
std::vector<std::vector<int64_t>> packed_starts(int64_t t) {
    std::vector<int64_t> row0 = {0};
    for (int64_t s : {t / 4, t / 4 + 1, (2 * t) / 3})
        if (s > row0.back() && s < t) row0.push_back(s);
    return {row0, {0}};
}

Problem make_problem(
    int64_t t, int64_t hq, int64_t hkv, int64_t d, int64_t window, int64_t g, bool sink, bool docs, uint64_t seed) {
    Problem p;
    p.q = op_randn({2, t, hq, d}, seed, 0);
    p.k = op_randn({2, t, hkv, d}, seed, 1);
    p.v = op_randn({2, t, hkv, d}, seed, 2);
    if (g > 0) {
        p.kg = op_randn({g, hkv, d}, seed, 3);
        p.vg = op_randn({g, hkv, d}, seed, 4);
    }
    if (sink) p.sink = op_randn({hq}, seed, 5);
    if (docs) p.doc_start = mt::testing::doc_start_map(packed_starts(t), t);
    p.window = window;
    return p;
}

// out, lse of the composed ops: attention_fwd over the local keys, then the global tokens and the sink merged in.
std::pair<Tensor, Tensor> composed_fwd(const Problem& p) {
    Tensor out = op_like(p.q), lse = Tensor::zeros({p.q.size(0), p.q.size(2), p.q.size(1)}, p.q.dtype());
    attention_fwd(p.q, p.k, p.v, out, lse, {}, {.doc_start = p.doc_start, .window = p.window});
    if (p.kg.defined() || p.sink.defined()) attention_global_fwd(p.q, p.kg, p.vg, p.sink, out, lse);
    return {out, lse};
}

// The definition with the mask written out: query i of row b, head h sees the global keys, the sink, and the local
// keys j with doc_start[b, i] <= j <= i and i - j < window.
std::pair<Tensor, Tensor> dense_reference(const Problem& p) {
    const int64_t b = p.q.size(0), t = p.q.size(1), hq = p.q.size(2), d = p.q.size(3), hkv = p.k.size(2);
    const int64_t g = p.kg.defined() ? p.kg.size(0) : 0;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    Tensor out = op_like(p.q), lse = Tensor::zeros({b, hq, t}, DType::f64);
    auto at = [](const Tensor& x, std::initializer_list<int64_t> idx) {
        int64_t flat = 0, i = 0;
        for (int64_t v : idx) flat = flat * x.size(static_cast<int>(i++)) + v;
        return core::tensor_get_flat(x, flat);
    };
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t h = 0; h < hq; ++h) {
            const int64_t kh = h / (hq / hkv);
            for (int64_t i = 0; i < t; ++i) {
                std::vector<double> s;
                std::vector<std::pair<const Tensor*, int64_t>> src;  // value rows: (tensor, row index)
                auto dot = [&](const Tensor& keys, std::initializer_list<int64_t> kidx) {
                    double acc = 0;
                    for (int64_t c = 0; c < d; ++c) {
                        std::vector<int64_t> full(kidx);
                        full.push_back(c);
                        int64_t flat = 0;
                        for (size_t a = 0; a < full.size(); ++a) flat = flat * keys.size(static_cast<int>(a)) + full[a];
                        acc += at(p.q, {bb, i, h, c}) * core::tensor_get_flat(keys, flat);
                    }
                    return acc * scale;
                };
                const int64_t doc = p.doc_start.defined() ? static_cast<int64_t>(at(p.doc_start, {bb, i})) : 0;
                for (int64_t j = 0; j <= i; ++j) {
                    const bool visible = j >= doc && (p.window == 0 || i - j < p.window);
                    if (!visible) continue;
                    s.push_back(dot(p.k, {bb, j, kh}));
                    src.push_back({&p.v, j});
                }
                for (int64_t j = 0; j < g; ++j) {
                    s.push_back(dot(p.kg, {j, kh}));
                    src.push_back({&p.vg, j});
                }
                double mx = -std::numeric_limits<double>::infinity();
                for (double x : s) mx = std::max(mx, x);
                const double sink = p.sink.defined() ? core::tensor_get_flat(p.sink, h) : 0.0;
                if (p.sink.defined()) mx = std::max(mx, sink);
                double z = p.sink.defined() ? std::exp(sink - mx) : 0.0;
                for (double x : s) z += std::exp(x - mx);
                for (int64_t c = 0; c < d; ++c) {
                    double o = 0;
                    for (size_t n = 0; n < s.size(); ++n) {
                        const auto& [vt, row] = src[n];
                        const double val = vt == &p.v ? at(p.v, {bb, row, kh, c}) : at(p.vg, {row, kh, c});
                        o += std::exp(s[n] - mx) / z * val;
                    }
                    core::tensor_set_flat(out, ((bb * t + i) * hq + h) * d + c, o);
                }
                core::tensor_set_flat(lse, (bb * hq + h) * t + i, mx + std::log(z));
            }
        }
    return {out, lse};
}

TEST(AttentionWindow, MatchesTheDenseMaskedReference) {
    const int64_t t = 70, hq = 4, hkv = 2, d = 8;
    int cases = 0;
    for (int64_t window : {int64_t{1}, int64_t{7}, int64_t{64}, t})
        for (int64_t g : {0, 1, 4})
            for (bool sink : {false, true})
                for (bool docs : {false, true}) {
                    SCOPED_TRACE(fmt::format("w {} g {} sink {} docs {}", window, g, sink, docs));
                    const Problem p = make_problem(t, hq, hkv, d, window, g, sink, docs, 100 + cases);
                    const auto [out, lse] = composed_fwd(p);
                    const auto [ref_out, ref_lse] = dense_reference(p);
                    EXPECT_LE(mt::testing::rho(out, ref_out), 1e-12);
                    EXPECT_LE(mt::testing::rho(lse, ref_lse), 1e-12);
                    ++cases;
                }
    EXPECT_EQ(cases, 48);
}

// w = n and g = 0: full causal attention, bit for bit (the window masks nothing); a window of 1 makes every query
// see only itself, so out = v.
TEST(AttentionWindow, FullWindowIsCausalAttentionAndWindowOneIsTheValue) {
    const int64_t t = 37, hq = 2, hkv = 1, d = 5;
    const Problem full = make_problem(t, hq, hkv, d, t, 0, false, false, 7);
    Problem plain = full;
    plain.window = 0;
    const auto [a, la] = composed_fwd(full);
    const auto [b, lb] = composed_fwd(plain);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
    EXPECT_EQ(std::memcmp(la.raw(), lb.raw(), la.nbytes()), 0);
    Problem one = full;
    one.window = 1;
    const auto [o1, l1] = composed_fwd(one);
    for (int64_t bb = 0; bb < 2; ++bb)
        for (int64_t i = 0; i < t; ++i)
            for (int64_t h = 0; h < hq; ++h)
                for (int64_t c = 0; c < d; ++c)
                    EXPECT_NEAR(core::tensor_get_flat(o1, ((bb * t + i) * hq + h) * d + c),
                                core::tensor_get_flat(full.v, ((bb * t + i) * hkv + h / hq) * d + c),
                                1e-12);
}

// loss = sum(dout * out) of the composed ops; their backward (attention_bwd with the merged out and lse, then
// attention_global_bwd) against central differences at entries of q, k, v, kg, vg and the sink.
TEST(AttentionWindow, GradientsMatchFiniteDifferences) {
    const int64_t t = 29, hq = 4, hkv = 2, d = 6;
    Problem p = make_problem(t, hq, hkv, d, 7, 3, true, true, 55);
    const Tensor dout = op_randn(p.q.shape(), 56, 0);
    const auto [out, lse] = composed_fwd(p);
    Tensor dq = op_like(p.q), dk = op_like(p.k), dv = op_like(p.v), dkg = op_like(p.kg), dvg = op_like(p.vg);
    Tensor dsink = Tensor::zeros(p.sink.shape(), DType::f64);
    attention_bwd(p.q, p.k, p.v, out, lse, dout, dq, dk, dv, {}, {.doc_start = p.doc_start, .window = p.window});
    attention_global_bwd(p.q, p.kg, p.vg, p.sink, out, lse, dout, dq, dkg, dvg, dsink);
    auto loss = [&]() {
        const auto [o, l] = composed_fwd(p);
        double s = 0.0;
        for (int64_t i = 0; i < o.numel(); ++i) s += core::tensor_get_flat(o, i) * core::tensor_get_flat(dout, i);
        return s;
    };
    const int checked = mt::testing::expect_central_differences(
        loss, {{&p.q, &dq}, {&p.k, &dk}, {&p.v, &dv}, {&p.kg, &dkg}, {&p.vg, &dvg}, {&p.sink, &dsink}}, [](int64_t n) {
            return std::vector<int64_t>{1, n / 3, n / 2 + 1, n - 1};
        });
    EXPECT_EQ(checked, 24);
}

TEST(AttentionWindow, RefusesBadArguments) {
    const Problem p = make_problem(9, 2, 1, 4, 3, 2, true, false, 3);
    Tensor out = op_like(p.q), lse = Tensor::zeros({2, 2, 9}, DType::f64);
    EXPECT_THROW(attention_fwd(p.q, p.k, p.v, out, lse, {}, {.window = -1}), core::Error);
    EXPECT_THROW(attention_global_fwd(p.q, p.kg, Tensor(), p.sink, out, lse), core::Error);
    EXPECT_THROW(attention_global_fwd(p.q, Tensor(), Tensor(), Tensor(), out, lse), core::Error);
    EXPECT_THROW(attention_global_fwd(p.q, p.kg, p.vg, Tensor::zeros({3}, DType::f64), out, lse), core::Error);
    EXPECT_THROW(attention_global_fwd(p.q, op_randn({2, 2, 4}, 1, 1), p.vg, p.sink, out, lse), core::Error);
}

// Harness cases of attention_global (with a window and a document map on the local part): gradient checks on the
// CPU and the CUDA parity of attention_fwd/bwd with the mask and of attention_global_fwd/bwd.
OpCase global_case(int64_t t, int64_t hq, int64_t hkv, int64_t d, int64_t window, int64_t g, bool sink) {
    const std::string name =
        fmt::format("attention_global_t{}_hq{}_hkv{}_d{}_w{}_g{}{}", t, hq, hkv, d, window, g, sink ? "_sink" : "");
    const Tensor host_docs = mt::testing::doc_start_map(packed_starts(t), t);
    OpCase c{
        "attention_global", name, [=] {
            const uint64_t s = op_seed(name);
            OpProblem p;
            p.inputs = {{"q", op_randn({2, t, hq, d}, s, 0), GradKind::written},
                        {"k", op_randn({2, t, hkv, d}, s, 1), GradKind::written},
                        {"v", op_randn({2, t, hkv, d}, s, 2), GradKind::written}};
            if (g > 0) {
                p.inputs.push_back({"kg", op_randn({g, hkv, d}, s, 3), GradKind::written});
                p.inputs.push_back({"vg", op_randn({g, hkv, d}, s, 4), GradKind::written});
            }
            if (sink) p.inputs.push_back({"sink", op_randn({hq}, s, 5), GradKind::accumulated});
            auto pick = [=](const std::vector<Tensor>& in) {
                const size_t extra = g > 0 ? 2 : 0;
                return std::array<Tensor, 3>{
                    g > 0 ? in[3] : Tensor(), g > 0 ? in[4] : Tensor(), sink ? in[3 + extra] : Tensor()};
            };
            auto forward = [=](const std::vector<Tensor>& in, const Tensor& out, const Tensor& lse) {
                const auto [kg, vg, sk] = pick(in);
                const AttentionMask mask{.doc_start = host_docs.to_device(in[0].device()), .window = window};
                attention_fwd(in[0], in[1], in[2], out, lse, {}, mask);
                attention_global_fwd(in[0], kg, vg, sk, out, lse);
                return mask;
            };
            auto lse_of = [=](const Tensor& q) {
                return Tensor::zeros({2, hq, t}, q.device() == core::Device::cuda ? DType::f32 : q.dtype(), q.device());
            };
            p.forward = [=](const std::vector<Tensor>& in) {
                Tensor out = op_like(in[0]), lse = lse_of(in[0]);
                forward(in, out, lse);
                return std::vector<Tensor>{out};
            };
            p.backward =
                [=](const std::vector<Tensor>& in, const std::vector<Tensor>& dout, const std::vector<Tensor>& grads) {
                    Tensor out = op_like(in[0]), lse = lse_of(in[0]);
                    const AttentionMask mask = forward(in, out, lse);
                    attention_bwd(in[0], in[1], in[2], out, lse, dout[0], grads[0], grads[1], grads[2], {}, mask);
                    const auto [kg, vg, sk] = pick(in);
                    const size_t extra = g > 0 ? 2 : 0;
                    attention_global_bwd(in[0],
                                         kg,
                                         vg,
                                         sk,
                                         out,
                                         lse,
                                         dout[0],
                                         grads[0],
                                         g > 0 ? grads[3] : Tensor(),
                                         g > 0 ? grads[4] : Tensor(),
                                         sink ? grads[3 + extra] : Tensor());
                };
            return p;
        }};
    return c;
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(global_case(13, 2, 1, 4, 4, 2, true));
    op_register(global_case(40, 4, 2, 8, 7, 4, false));
    op_register(global_case(23, 3, 3, 5, 0, 0, true));  // the sink alone, no window
    op_register(global_case(70, 2, 1, 6, 64, 1, true));
    return true;
}();

// ---- GPU: every CUDA kernel family with a document map and a window against the CPU f32 reference ----

Tensor host64(const Tensor& t) {
    return t.to_device(core::Device::cpu).to(DType::f64);
}

// rho of got against ref (f64 host copies); NaN fails.
void expect_rho(const std::string& name, const char* what, const Tensor& got, const Tensor& ref, double budget) {
    const double r = mt::testing::rho(host64(got), host64(ref));
    std::printf("[ GPU PARITY ] %s %s: rho %.3e (budget %.0e)\n", name.c_str(), what, r, budget);
    EXPECT_LE(r, budget) << name << " " << what;
}

// Documents of row 0 start at 0, t/5 + 3, t/2 + 1 (two tiles apart and mid-tile) and t - 2; row 1 holds one.
Tensor gpu_doc_map(int64_t t) {
    return mt::testing::doc_start_map({{0, t / 5 + 3, t / 2 + 1, t - 2}, {0}}, t);
}

// The forward and backward of attention (with the mask) and of the global merge (g tokens, a sink) in bf16 on the
// GPU against the CPU f32 reference on the same rounded inputs; `expect` names the backward kernels that must run.
void masked_gpu_parity(int64_t t,
                       int64_t d,
                       int64_t window,
                       bool docs,
                       int64_t g,
                       AttentionKernel kernel,
                       const char* expect,
                       bool fast_bwd = true) {
    const int64_t b = 2, hq = 4, hkv = 2;
    const std::string name = fmt::format("masked_t{}_d{}_w{}{}_g{}_{}", t, d, window, docs ? "_docs" : "", g, expect);
    // Both deterministic wgmma backwards (the ordered 5-matmul one and the two-kernel one) draw the inputs the case
    // drew before the ordered one existed, under "cuda-wgmma". A fresh draw put dsink (4 heads, each a sum over every
    // token of terms that cancel, from the bf16 out) at rho 1.85e-2 in the d 72 case on an H100, whatever the
    // backward: attention_global_bwd computes it from the forward's out and lse alone.
    const std::string ordered = "cuda-wgmma-ordered";
    const std::string seed_name =
        name.ends_with(ordered) ? name.substr(0, name.size() - ordered.size()) + "cuda-wgmma" : name;
    const uint64_t s = op_seed(seed_name);
    auto rounded = [](const Tensor& x) { return x.to(DType::bf16).to(DType::f32); };
    auto gpu = [](const Tensor& x) { return x.to(DType::bf16).to_device(core::Device::cuda); };
    const Tensor q = rounded(op_randn({b, t, hq, d}, s, 0)), k = rounded(op_randn({b, t, hkv, d}, s, 1));
    const Tensor v = rounded(op_randn({b, t, hkv, d}, s, 2)), dout = rounded(op_randn({b, t, hq, d}, s, 3));
    const Tensor kg = g > 0 ? rounded(op_randn({g, hkv, d}, s, 4)) : Tensor();
    const Tensor vg = g > 0 ? rounded(op_randn({g, hkv, d}, s, 5)) : Tensor();
    const Tensor sink = g > 0 ? rounded(op_randn({hq}, s, 6)) : Tensor();
    const Tensor map = docs ? gpu_doc_map(t) : Tensor();
    auto run = [&](const Tensor& q_,
                   const Tensor& k_,
                   const Tensor& v_,
                   const Tensor& dout_,
                   const Tensor& kg_,
                   const Tensor& vg_,
                   const Tensor& sink_,
                   const Tensor& map_,
                   const AttentionOptions& options) {
        const core::Device dev = q_.device();
        const DType stats = dev == core::Device::cuda ? DType::f32 : q_.dtype();
        std::vector<Tensor> r = {Tensor::zeros(q_.shape(), q_.dtype(), dev),
                                 Tensor::zeros({b, hq, t}, stats, dev),
                                 Tensor::zeros(q_.shape(), q_.dtype(), dev),
                                 Tensor::zeros(k_.shape(), k_.dtype(), dev),
                                 Tensor::zeros(k_.shape(), k_.dtype(), dev)};
        const AttentionMask mask{.doc_start = map_, .window = window};
        attention_fwd(q_, k_, v_, r[0], r[1], options, mask);
        if (g > 0) attention_global_fwd(q_, kg_, vg_, sink_, r[0], r[1]);
        attention_bwd(q_, k_, v_, r[0], r[1], dout_, r[2], r[3], r[4], options, mask);
        if (g > 0) {
            r.push_back(Tensor::zeros(kg_.shape(), kg_.dtype(), dev));
            r.push_back(Tensor::zeros(kg_.shape(), kg_.dtype(), dev));
            r.push_back(Tensor::zeros({hq}, dev == core::Device::cuda ? DType::f32 : q_.dtype(), dev));
            attention_global_bwd(q_, kg_, vg_, sink_, r[0], r[1], dout_, r[2], r[5], r[6], r[7]);
        }
        return r;
    };
    const std::vector<Tensor> ref = run(q, k, v, dout, kg, vg, sink, map, {});
    std::string chosen;
    AttentionOptions options;
    options.kernel = kernel;
    options.fast_bwd = fast_bwd;
    options.chosen = &chosen;
    const std::vector<Tensor> got = run(gpu(q),
                                        gpu(k),
                                        gpu(v),
                                        gpu(dout),
                                        g > 0 ? gpu(kg) : Tensor(),
                                        g > 0 ? gpu(vg) : Tensor(),
                                        g > 0 ? gpu(sink) : Tensor(),
                                        docs ? map.to_device(core::Device::cuda) : Tensor(),
                                        options);
    EXPECT_EQ(chosen, expect) << name;
    const char* names[] = {"out", "lse", "dq", "dk", "dv", "dkg", "dvg", "dsink"};
    for (size_t i = 0; i < ref.size(); ++i) expect_rho(name, names[i], got[i], ref[i], 1e-2);
}

// The masks every family runs: a document map alone (tiles skipped before each query block's first document start
// and after each key block's last viewer), a window alone (w not a tile multiple, and below one tile), both, and
// both with global tokens and a sink.
void masked_cases(int64_t d, AttentionKernel kernel, const char* expect, bool fast_bwd = true) {
    masked_gpu_parity(300, d, 0, true, 0, kernel, expect, fast_bwd);
    masked_gpu_parity(523, d, 130, false, 0, kernel, expect, fast_bwd);
    masked_gpu_parity(523, d, 37, true, 0, kernel, expect, fast_bwd);
    masked_gpu_parity(1000, d, 200, true, 4, kernel, expect, fast_bwd);
}

TEST(GpuAttentionMask, WgmmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    for (int64_t d : {64, 72, 128}) masked_cases(d, AttentionKernel::wgmma, "cuda-wgmma-ordered");
    masked_cases(64, AttentionKernel::wgmma, "cuda-wgmma", /*fast_bwd=*/false);  // the two-kernel backward
}

TEST(GpuAttentionMask, WgmmaFastBackwardParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    if (!attention_wgmma_here()) GTEST_SKIP() << "wgmma needs a Hopper GPU";
    core::ExecCtx ctx = core::exec();
    ctx.deterministic = false;
    const core::ExecScope scope(ctx);
    for (int64_t d : {64, 72, 128}) masked_cases(d, AttentionKernel::wgmma, "cuda-wgmma-fast");
}

TEST(GpuAttentionMask, MmaParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    for (int64_t d : {64, 72, 128}) masked_cases(d, AttentionKernel::mma, "cuda-mma");
}

TEST(GpuAttentionMask, GenericParityBf16) {
    if (!attention_gpu_here()) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    masked_cases(36, AttentionKernel::automatic, "cuda-generic");
    masked_gpu_parity(300, 64, 50, true, 2, AttentionKernel::generic, "cuda-generic");
}

}  // namespace
}  // namespace mt::ops::test
