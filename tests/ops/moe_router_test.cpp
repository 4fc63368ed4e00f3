// Cases and argument checks of the MoE router (ops/moe_router.h). Inputs are built so that every adjacent pair among
// the top K + 1 biased scores of a row is at least 1e-3 apart (conventions §1.4: away from top-k ties), so the finite
// differences never change the selection or its order.
#include "ops/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

// Logits [n, e] and bias [e] (f64). Sigmoid: row i's biased keys s + b are a random permutation of the grid
// 0.9 - r * 0.8 / e (r = 0..e-1), so adjacent keys are 0.8 / e apart. Softmax: logits are a permuted grid of
// spacing 0.4 (no bias).
std::pair<Tensor, Tensor> router_inputs(int64_t n, int64_t e, MoeScore score, uint64_t seed) {
    Tensor z = Tensor::zeros({n, e}, DType::f64), b = Tensor::zeros({e}, DType::f64);
    if (score == MoeScore::sigmoid) core::rng_fill_uniform(b, seed, 1, -0.04, 0.04);
    std::vector<int64_t> perm(static_cast<size_t>(e));
    for (int64_t i = 0; i < n; ++i) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = e - 1; j > 0; --j)  // Fisher-Yates from Philox
            std::swap(perm[static_cast<size_t>(j)],
                      perm[core::rng_u64(seed, 2, static_cast<uint64_t>(i * e + j)) % static_cast<uint64_t>(j + 1)]);
        for (int64_t r = 0; r < e; ++r) {
            const int64_t j = perm[static_cast<size_t>(r)];
            double v;
            if (score == MoeScore::sigmoid) {
                const double s = 0.9 - static_cast<double>(r) * 0.8 / static_cast<double>(e) - b.at({j});
                v = std::log(s / (1.0 - s));
            } else {
                v = 1.5 - 0.4 * static_cast<double>(r);
            }
            core::tensor_set_flat(z, i * e + j, v);
        }
    }
    return {z, b};
}

OpCase router_case(int64_t n, int64_t e, int64_t k, MoeScore score, bool normalize, double scale) {
    const std::string name = fmt::format("moe_router_n{}_e{}_k{}_{}{}_scale{}",
                                         n,
                                         e,
                                         k,
                                         score == MoeScore::sigmoid ? "sigmoid" : "softmax",
                                         normalize ? "_norm" : "",
                                         static_cast<int>(std::lround(scale * 1000)));
    const MoeRouterOptions opt{k, score, normalize, scale};
    return {"moe_router", name, [=] {
                OpProblem p;
                auto [z, b] = router_inputs(n, e, score, op_seed(name));
                p.inputs = {{"logits", z, GradKind::written}, {"bias", b, GradKind::none}};
                // forward: the gates and the scores (the scores enter the loss too, which exercises dscores)
                auto run = [opt](const std::vector<Tensor>& in, Tensor& idx) {
                    const int64_t rows = in[0].size(0), experts = in[0].size(1);
                    Tensor s = op_like(in[0]), g = op_like(in[0], {rows, opt.top_k});
                    idx = Tensor::zeros({rows, opt.top_k}, DType::i32, in[0].device());
                    const Tensor cut = experts > opt.top_k ? op_like(in[0], {rows}) : Tensor();
                    moe_router_fwd(in[0], in[1], s, idx, g, cut, opt);
                    return std::vector<Tensor>{g, s};
                };
                p.forward = [run](const std::vector<Tensor>& in) {
                    Tensor idx;
                    return run(in, idx);
                };
                p.backward = [run, opt](const std::vector<Tensor>& in,
                                        const std::vector<Tensor>& dout,
                                        const std::vector<Tensor>& grads) {
                    Tensor idx;
                    const std::vector<Tensor> out = run(in, idx);
                    moe_router_bwd(out[1], idx, out[0], dout[0], dout[1], grads[0], opt);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    // One element: the backward's s (1 - s) reads the scores, which the bf16 run stores rounded (relative error up to
    // 2^-9 / (1 - s)), and nothing averages it out: 1.7e-2 measured on an H200.
    OpCase one = router_case(1, 1, 1, MoeScore::sigmoid, true, 1.0);
    one.parity.bf16_budget = 3e-2;
    one.parity.budget_reason = "a single score; s (1 - s) from a bf16-rounded s near 0.9";
    op_register(one);
    op_register(router_case(7, 5, 2, MoeScore::sigmoid, true, 2.5));
    op_register(router_case(7, 5, 2, MoeScore::sigmoid, false, 2.5));
    op_register(router_case(13, 16, 4, MoeScore::sigmoid, true, 1.0));
    op_register(router_case(11, 9, 3, MoeScore::softmax, true, 1.0));
    op_register(router_case(11, 9, 3, MoeScore::softmax, false, 2.0));
    op_register(router_case(67, 37, 8, MoeScore::sigmoid, true, 2.446));
    op_register(router_case(3, 1024, 8, MoeScore::sigmoid, true, 2.5));  // the largest expert count
    // the CUDA kernel at the benchmark's shapes (one warp per token, 2 and 8 experts per lane)
    op_register(op_parity_only(router_case(4096, 64, 8, MoeScore::sigmoid, true, 2.5)));
    op_register(op_parity_only(router_case(2000, 256, 8, MoeScore::sigmoid, true, 2.5)));
    op_register(op_parity_only(router_case(999, 200, 6, MoeScore::softmax, false, 1.0)));
    return true;
}();

// Per-group bias (bias [G, E] with bias_rows, the per-modality bias of multimodal.md §4): every row's routing equals
// the routing of that row alone under its group's 1-D bias, bit for bit, on the same device.
void bias_rows_equal_per_row_bias(core::Device device, DType dtype) {
    const int64_t n = 29, e = 11, k = 3, groups = 2;
    auto [z, b0] = router_inputs(n, e, MoeScore::sigmoid, op_seed("moe_router_bias_rows"));
    Tensor bias = Tensor::zeros({groups, e}, DType::f64), rows = Tensor::zeros({n}, DType::i32);
    core::rng_fill_uniform(bias, op_seed("moe_router_bias_rows"), 7, -0.3, 0.3);
    for (int64_t i = 0; i < n; ++i) rows.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 5 == 0 ? 1 : 0);
    const MoeRouterOptions opt{k, MoeScore::sigmoid, true, 2.5};
    auto on = [&](const Tensor& t) { return t.to(t.dtype() == DType::i32 ? DType::i32 : dtype).to_device(device); };
    const Tensor zd = on(z), bd = on(bias), rd = rows.to_device(device);
    const Tensor s = Tensor::zeros({n, e}, dtype, device), g = Tensor::zeros({n, k}, dtype, device);
    const Tensor idx = Tensor::zeros({n, k}, DType::i32, device), cut = Tensor::zeros({n}, dtype, device);
    moe_router_fwd(zd, bd, s, idx, g, cut, opt, rd);
    const Tensor idx_h = idx.to_device(core::Device::cpu), cut_h = cut.to_device(core::Device::cpu);
    Tensor want_idx = Tensor::zeros({n, k}, DType::i32), want_cut = Tensor::zeros({n}, DType::f64);
    for (int64_t i = 0; i < n; ++i) {  // row by row with its group's bias
        const int32_t m = rows.data<int32_t>()[i];
        const Tensor zi = on(z.slice(0, i, i + 1).clone()), bi = on(bias.slice(0, m, m + 1).clone().reshape({e}));
        const Tensor si = Tensor::zeros({1, e}, dtype, device), gi = Tensor::zeros({1, k}, dtype, device);
        const Tensor ii = Tensor::zeros({1, k}, DType::i32, device), ci = Tensor::zeros({1}, dtype, device);
        moe_router_fwd(zi, bi, si, ii, gi, ci, opt);
        const Tensor ih = ii.to_device(core::Device::cpu), ch = ci.to_device(core::Device::cpu);
        for (int64_t q = 0; q < k; ++q) want_idx.data<int32_t>()[i * k + q] = ih.data<int32_t>()[q];
        core::tensor_set_flat(want_cut, i, core::tensor_get_flat(ch, 0));
    }
    // Bit for bit (budget 0), through op_expect_parity so that the harness counts the comparisons.
    const std::string name = fmt::format("moe_router_bias_rows_{}", core::dtype_name(dtype));
    op_expect_parity(name, "expert indices", idx_h.to(DType::f64), want_idx.to(DType::f64), 0.0);
    op_expect_parity(name, "cutoffs", cut_h.to(DType::f64), want_cut, 0.0);
}

[[maybe_unused]] const bool kRegisteredBiasRows = [] {
    op_register_check("moe_router", "moe_router_bias_rows_equal_per_row_bias", [] {
        bias_rows_equal_per_row_bias(core::Device::cpu, DType::f64);
        bias_rows_equal_per_row_bias(core::Device::cpu, DType::f32);
    });
    op_register_parity_check("moe_router", "moe_router_bias_rows_cuda", [] {
        bias_rows_equal_per_row_bias(core::Device::cuda, DType::f32);
        bias_rows_equal_per_row_bias(core::Device::cuda, DType::bf16);
    });
    return true;
}();

// Selection, tie rule, cutoff and gates on hand-built scores.
TEST(MoeRouterOp, SelectionTiesCutoffAndGates) {
    // logits 0 -> s = 0.5 for experts 0..3; bias favours 2 and 3 equally, so ties go to the lower index.
    const Tensor z = Tensor::zeros({1, 4}, DType::f64), b = Tensor::zeros({4}, DType::f64);
    core::tensor_set_flat(b, 2, 0.1);
    core::tensor_set_flat(b, 3, 0.1);
    const Tensor s = op_like(z), idx = Tensor::zeros({1, 2}, DType::i32), g = op_like(z, {1, 2}), cut = op_like(z, {1});
    moe_router_fwd(z, b, s, idx, g, cut, {2, MoeScore::sigmoid, true, 2.5});
    EXPECT_EQ(idx.at({0, 0}), 2);
    EXPECT_EQ(idx.at({0, 1}), 3);
    EXPECT_DOUBLE_EQ(g.at({0, 0}), 1.25);  // the bias does not enter the gates: 2.5 * 0.5 / 1.0
    EXPECT_DOUBLE_EQ(cut.at({0}), 0.5);    // the third key: expert 0, s + b = 0.5
    moe_router_fwd(z, b, s, idx, g, Tensor(), {2, MoeScore::sigmoid, false, 2.0});
    EXPECT_DOUBLE_EQ(g.at({0, 1}), 1.0);
}

TEST(OpArgs, MoeRouterShapesAndDtypes) {
    const Tensor z = Tensor::zeros({3, 4}, DType::f64), s = op_like(z), g = op_like(z, {3, 2});
    const Tensor idx = Tensor::zeros({3, 2}, DType::i32);
    const MoeRouterOptions opt{2, MoeScore::sigmoid, true, 1.0};
    moe_router_fwd(z, Tensor(), s, idx, g, Tensor(), opt);
    expect_op_error(
        [&] {
            moe_router_fwd(z, Tensor(), s, idx, g, Tensor(), {5, MoeScore::sigmoid, true, 1.0});
        },
        "moe_router_fwd: top_k = 5 must be in [1, 4]");
    expect_op_error(
        [&] {
            moe_router_fwd(z, Tensor(), s, Tensor::zeros({3, 2}, DType::f32), g, Tensor(), opt);
        },
        "moe_router_fwd: indices has dtype f32, expected i32");
    expect_op_error([&] { moe_router_fwd(z, Tensor::zeros({3}, DType::f64), s, idx, g, Tensor(), opt); },
                    "moe_router_fwd: bias has shape [3], expected [4]");
    const Tensor rows = Tensor::zeros({3}, DType::i32);
    expect_op_error([&] { moe_router_fwd(z, Tensor(), s, idx, g, Tensor(), opt, rows); },
                    "moe_router_fwd: bias_rows needs a bias [G, E]");
    expect_op_error(
        [&] {
            moe_router_fwd(z, Tensor::zeros({2, 3}, DType::f64), s, idx, g, Tensor(), opt, rows);
        },
        "moe_router_fwd: bias has shape [2, 3], expected [G, 4] with G >= 1");
    core::tensor_set_flat(rows, 2, 2);
    expect_op_error(
        [&] {
            moe_router_fwd(z, Tensor::zeros({2, 4}, DType::f64), s, idx, g, Tensor(), opt, rows);
        },
        "moe_router_fwd: bias_rows[2] = 2 is outside [0, 2)");
    expect_op_error([&] { moe_router_fwd(z, Tensor(), s.to(DType::f32), idx, g, Tensor(), opt); },
                    "moe_router_fwd: scores has dtype f32, expected f64 (the dtype of logits)");
    expect_op_error(
        [&] {
            moe_router_fwd(z, Tensor(), s, idx, g, op_like(z, {3}), {4, MoeScore::sigmoid, true, 1.0});
        },
        "moe_router_fwd: indices has shape [3, 2], expected [3, 4]");
    expect_op_error(
        [&] {
            moe_router_fwd(op_cuda_view({3, 4}, DType::f32), Tensor(), s, idx, g, Tensor(), opt);
        },
        "all tensors of one call must be on the same device");
    const Tensor bad = Tensor::zeros({3, 2}, DType::i32);
    core::tensor_set_flat(bad, 1, 7);
    expect_op_error([&] { moe_router_bwd(s, bad, g, g, Tensor(), op_like(z), opt); },
                    "moe_router_bwd: indices[1] = 7 is outside [0, 4)");
}

}  // namespace
}  // namespace mt::ops::test
