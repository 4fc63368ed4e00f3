// QK-clip, the layer half (muon.md §4 and §9 test 6): the factor function's unit cases (alpha 0.5 gives sqrt(eta) on
// both sides, alpha 1 eta on Wq only, groups at or below tau untouched, the counts), qk_clip_scale_rows on whole
// weights and on flat element ranges (rows with factor 1 bitwise unchanged), the attention layer's per-head maxima
// (each the direct maximum over its causal pairs, max_logit their maximum, reset and running), and the clip itself:
// a GQA and an MHA layer with Wq and Wk scaled so that one kv group's max logit is 400 (two groups for MHA), after
// the clip at tau = 100 recompute a max logit <= tau (1 + 1e-6) in every clipped group, while the heads of the
// groups below tau keep bitwise the same weights, maxima and attention output. GpuQkClip: the CUDA scaling (a host
// round trip) equals the CPU's bitwise, and the clip of a bf16 mixed-precision layer on the GPU (both passed on an
// H100, 2026-12-05, with GpuAttentionMaxLogit and the CPU cases).
#include "nn/qk_clip.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layers/attention_layer.h"
#include "ops/op_harness.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(QkClipFactors, MhaAlphaHalfGivesSqrtEtaOnBothSides) {
    // Head 0 at 400 (eta 1/4), head 3 exactly at tau: only head 0 is clipped.
    const QkClipFactors f = qk_clip_factors({400.0, 50.0, 90.0, 100.0}, 4, 4, 3, 100.0, 0.5);
    ASSERT_EQ(f.q_row_scale.size(), 12u);
    ASSERT_EQ(f.k_row_scale.size(), 12u);
    for (size_t r = 0; r < 12; ++r) {
        EXPECT_EQ(f.q_row_scale[r], r < 3 ? 0.5 : 1.0) << r;
        EXPECT_EQ(f.k_row_scale[r], r < 3 ? 0.5 : 1.0) << r;
    }
    EXPECT_EQ(f.group_eta, (std::vector<double>{0.25, 1.0, 1.0, 1.0}));
    EXPECT_EQ(f.heads_clipped, 1);
    EXPECT_EQ(f.groups_clipped, 1);
    EXPECT_TRUE(f.any);
}

TEST(QkClipFactors, GqaGroupsTakeTheMaxOfTheirHeads) {
    // 6 query heads in 2 kv groups of 3, D = 2: group 0's max is 400, group 1's 100.5 (each from one head).
    const std::vector<double> heads = {50.0, 400.0, 20.0, 99.0, 100.0, 100.5};
    EXPECT_EQ(qk_clip_group_max(heads, 6, 2), (std::vector<double>{400.0, 100.5}));
    const double eta1 = 100.0 / 100.5;
    for (double alpha : {0.5, 1.0, 0.0, 0.3}) {
        SCOPED_TRACE(alpha);
        const QkClipFactors f = qk_clip_factors(heads, 6, 2, 2, 100.0, alpha);
        ASSERT_EQ(f.q_row_scale.size(), 12u);
        ASSERT_EQ(f.k_row_scale.size(), 4u);
        EXPECT_EQ(f.heads_clipped, 6);
        EXPECT_EQ(f.groups_clipped, 2);
        EXPECT_TRUE(f.any);
        EXPECT_EQ(f.group_eta, (std::vector<double>{0.25, eta1}));
        for (size_t r = 0; r < 12; ++r) {
            const double eta = r < 6 ? 0.25 : eta1;  // rows of heads 0-2, then 3-5
            const double q = f.q_row_scale[r], k = f.k_row_scale[r / 6 * 2];
            if (alpha == 0.5) {
                EXPECT_EQ(q, std::sqrt(eta));
                EXPECT_EQ(k, std::sqrt(eta));
            } else if (alpha == 1.0) {
                EXPECT_EQ(q, eta);
                EXPECT_EQ(k, 1.0);
            } else if (alpha == 0.0) {
                EXPECT_EQ(q, 1.0);
                EXPECT_EQ(k, eta);
            } else {
                EXPECT_NEAR(q, std::pow(eta, 0.3), 1e-15);
            }
            EXPECT_NEAR(q * k, eta, 1e-15) << r;  // the group's logits scale by eta
        }
        for (size_t r = 0; r < 4; ++r) EXPECT_EQ(f.k_row_scale[r], f.k_row_scale[r / 2 * 2]) << "one factor per head";
    }
}

TEST(QkClipFactors, NothingAboveTauOrNotFiniteLeavesAllRowsAlone) {
    for (const std::vector<double>& heads : {std::vector<double>{100.0, 3.0, -kInf, 99.9},
                                             std::vector<double>{-kInf, -kInf, -kInf, -kInf},
                                             std::vector<double>{std::nan(""), 400.0, kInf, 1.0}}) {
        // The last: group 0 holds a NaN head (a broken step), group 1 an infinite one; neither is scaled.
        const QkClipFactors f = qk_clip_factors(heads, 4, 2, 5);
        EXPECT_FALSE(f.any);
        EXPECT_EQ(f.heads_clipped, 0);
        EXPECT_EQ(f.groups_clipped, 0);
        EXPECT_EQ(f.q_row_scale, std::vector<double>(20, 1.0));
        EXPECT_EQ(f.k_row_scale, std::vector<double>(10, 1.0));
    }
    // Defaults: tau 100, alpha 0.5.
    const QkClipFactors f = qk_clip_factors({1.0, 1e4}, 2, 1, 1);
    EXPECT_EQ(f.q_row_scale, std::vector<double>(2, 0.1));
    EXPECT_EQ(f.k_row_scale, std::vector<double>(1, 0.1));
}

TEST(QkClipFactors, BadInputIsRefused) {
    EXPECT_THROW(qk_clip_factors({1.0, 2.0, 3.0}, 3, 2, 4), core::Error);  // 3 heads in 2 groups
    EXPECT_THROW(qk_clip_factors({1.0, 2.0}, 4, 2, 4), core::Error);       // 2 maxima for 4 heads
    EXPECT_THROW(qk_clip_factors({1.0, 2.0}, 2, 1, 4, 0.0), core::Error);  // tau 0
    EXPECT_THROW(qk_clip_factors({1.0, 2.0}, 2, 1, 4, 100.0, 1.5), core::Error);
    const Tensor w = Tensor::zeros({3, 2}, DType::f32);
    EXPECT_THROW(qk_clip_scale_rows(w, {1.0, 1.0}), core::Error);                   // 2 factors, 3 rows
    EXPECT_THROW(qk_clip_scale_rows_range(w, {1.0, 1.0, 0.5}, 2, 7), core::Error);  // past the end
    EXPECT_THROW(qk_clip_scale_rows(Tensor::zeros({3, 2}, DType::bf16), {1, 1, 1}), core::Error);
    EXPECT_THROW(qk_clip_scale_rows(Tensor::zeros({6}, DType::f32), {1, 1, 1, 1, 1, 1}), core::Error);
}

Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
    Tensor w = Tensor::zeros({rows, cols}, dtype);
    for (int64_t i = 0; i < w.numel(); ++i) core::tensor_set_flat(w, i, core::rng_normal(seed, 0, i));
    return w;
}

TEST(QkClipScaleRows, ScalesTheRowsAndLeavesFactorOneBitwise) {
    const std::vector<double> scale = {1.0, 0.5, 0.3, 1.0, 2.0};
    for (DType dtype : {DType::f32, DType::f64}) {
        SCOPED_TRACE(dtype_name(dtype));
        const Tensor before = random_matrix(5, 3, dtype, 11);
        const Tensor w = before.clone();
        qk_clip_scale_rows(w, scale);
        for (int64_t e = 0; e < 15; ++e) {
            const double old = core::tensor_get_flat(before, e), s = scale[static_cast<size_t>(e / 3)];
            const double want = dtype == DType::f32 ? static_cast<float>(old * s) : old * s;
            EXPECT_EQ(core::tensor_get_flat(w, e), want) << e;
        }
        const size_t row = 3 * core::dtype_size(dtype);
        EXPECT_EQ(std::memcmp(w.raw(), before.raw(), row), 0);
        EXPECT_EQ(std::memcmp(static_cast<char*>(w.raw()) + 3 * row, static_cast<char*>(before.raw()) + 3 * row, row),
                  0);
    }
}

TEST(QkClipScaleRows, ElementRangesTouchOnlyTheirElementsAndPartitionTheWhole) {
    const std::vector<double> scale = {1.0, 0.5, 0.3, 1.0, 2.0};
    for (DType dtype : {DType::f32, DType::f64}) {
        SCOPED_TRACE(dtype_name(dtype));
        const Tensor before = random_matrix(5, 3, dtype, 12);
        const Tensor whole = before.clone(), part = before.clone();
        qk_clip_scale_rows(whole, scale);
        // [4, 13): row 1 from its second element, row 2, row 3 (factor 1), row 4's first element.
        qk_clip_scale_rows_range(part, scale, 4, 13);
        for (int64_t e = 0; e < 15; ++e) {
            const Tensor& want = e >= 4 && e < 13 ? whole : before;
            EXPECT_EQ(core::tensor_get_flat(part, e), core::tensor_get_flat(want, e)) << e;
        }
        // Owned slices [0, 4), [4, 13), [13, 15) (one of them empty on the way) give the whole weight's bits.
        qk_clip_scale_rows_range(part, scale, 0, 4);
        qk_clip_scale_rows_range(part, scale, 13, 13);
        qk_clip_scale_rows_range(part, scale, 13, 15);
        EXPECT_EQ(std::memcmp(part.raw(), whole.raw(), whole.nbytes()), 0);
    }
}

TEST(GpuQkClip, ScaleRowsOnTheDeviceEqualsTheHost) {
    if (!ops::test::op_gpu_available()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    std::vector<double> scale(37, 1.0);
    for (size_t r = 8; r < 16; ++r) scale[r] = 0.25;  // a clipped head of 8 rows
    scale[36] = 0.7;
    for (DType dtype : {DType::f32, DType::f64}) {
        SCOPED_TRACE(dtype_name(dtype));
        const Tensor host = random_matrix(37, 19, dtype, 13), dev = host.to_device(core::Device::cuda);
        const Tensor host_part = host.clone(), dev_part = host.to_device(core::Device::cuda);
        qk_clip_scale_rows(host, scale);
        qk_clip_scale_rows(dev, scale);
        EXPECT_EQ(std::memcmp(dev.to_device(core::Device::cpu).raw(), host.raw(), host.nbytes()), 0);
        qk_clip_scale_rows_range(host_part, scale, 150, 690);
        qk_clip_scale_rows_range(dev_part, scale, 150, 690);
        EXPECT_EQ(std::memcmp(dev_part.to_device(core::Device::cpu).raw(), host_part.raw(), host.nbytes()), 0);
    }
}

// A softmax attention layer (RoPE) with its table and input: on the CPU (f32 or f64, one tensor per weight), or on
// the GPU in bf16 mixed precision (f32 masters, the forward's bf16 copy refreshed from them).
struct LayerRig {
    ModelConfig cfg;
    Precision precision;
    ParamTable table;
    std::unique_ptr<AttentionLayer> layer;
    Tensor x, out;
    int64_t batch = 2, seq = 19;

    LayerRig(int64_t n_kv_heads, const Precision& p) : precision(p) {
        const bool gpu = p.device == core::Device::cuda;
        cfg.vocab_size = 37;
        cfg.d_model = gpu ? 256 : 32;  // head_dim 64 on the GPU (the flash kernels' size), 8 on the CPU
        cfg.n_layers = 2;
        cfg.n_heads = 4;
        cfg.n_kv_heads = n_kv_heads;
        cfg.d_ff = 24;
        cfg.max_seq_len = 128;
        cfg.init_std = 0.2;
        cfg.attn_pos = "rope";
        seq = gpu ? 100 : 19;
        layer = std::make_unique<AttentionLayer>(table, "attn", cfg);
        table.finalize(precision);
        table.initialize(5);
        layer->resize(batch, seq, precision);
        layer->set_track_max_logit(true);
        Tensor host = Tensor::zeros({batch * seq, cfg.d_model}, DType::f64);
        for (int64_t i = 0; i < host.numel(); ++i) core::tensor_set_flat(host, i, core::rng_normal(2, 0, i));
        x = host.to(precision.compute).to_device(precision.device);
        out = Tensor::zeros(x.shape(), precision.compute, precision.device);
    }
    int64_t head_dim() const {
        return layer->head_dim();
    }
    // One tracked forward from reset: the per-head maxima.
    std::vector<double> forward() {
        layer->reset_max_logit();
        layer->forward(x, out);
        layer->collect_max_logit();  // the row maxima stay on the device until collected (the model does it per pass)
        return layer->head_max_logit();
    }
    // The forward's attention output [B, T, Hq, D] (saved for backward), on the host.
    Tensor attention_out() {
        return layer->saved_for_backward()[3].tensor->to_device(core::Device::cpu);
    }
    Tensor master_on_host(int index) const {
        return table.master(index).to_device(core::Device::cpu);
    }
    // Per head, max over the causal pairs of q.k / sqrt(D) from the forward's saved (rotated) q and k, in f64.
    std::vector<double> direct_head_max() {
        const std::vector<SavedTensor> saved = layer->saved_for_backward();
        const Tensor q = saved[0].tensor->to_device(core::Device::cpu).to(DType::f64);  // [B, T, Hq, D]
        const Tensor k = saved[1].tensor->to_device(core::Device::cpu).to(DType::f64);  // [B, T, Hkv, D]
        const int64_t hq = cfg.n_heads, d = head_dim(), group = cfg.n_heads / cfg.n_kv_heads;
        std::vector<double> m(static_cast<size_t>(hq), -kInf);
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t h = 0; h < hq; ++h)
                for (int64_t i = 0; i < seq; ++i)
                    for (int64_t j = 0; j <= i; ++j) {
                        double dot = 0.0;
                        for (int64_t e = 0; e < d; ++e) dot += q.at({b, i, h, e}) * k.at({b, j, h / group, e});
                        m[static_cast<size_t>(h)] = std::max(m[static_cast<size_t>(h)], dot / std::sqrt(double(d)));
                    }
        return m;
    }
};

// Multiplies rows [r0, r1) of a master weight by c (the test's own loop, on the host) and refreshes the forward's copy.
void scale_rows_by(ParamTable& table, int index, int64_t r0, int64_t r1, double c) {
    const Tensor w = table.master(index), host = w.to_device(core::Device::cpu);
    for (int64_t e = r0 * w.size(1); e < r1 * w.size(1); ++e)
        core::tensor_set_flat(host, e, core::tensor_get_flat(host, e) * c);
    w.copy_from(host);
    if (table.precision().has_master_copy()) table.refresh_params_from_master();
}

bool rows_equal(const Tensor& a, const Tensor& b, int64_t r0, int64_t r1) {
    const size_t row = static_cast<size_t>(a.size(1)) * core::dtype_size(a.dtype());
    return std::memcmp(static_cast<const char*>(a.raw()) + r0 * row,
                       static_cast<const char*>(b.raw()) + r0 * row,
                       static_cast<size_t>(r1 - r0) * row) == 0;
}

TEST(AttentionHeadMaxLogit, EachHeadIsItsDirectMaximumAndMaxLogitTheirs) {
    for (int64_t hkv : {int64_t{2}, int64_t{4}})
        for (DType dtype : {DType::f64, DType::f32}) {
            SCOPED_TRACE(fmt::format("hkv {} {}", hkv, dtype_name(dtype)));
            LayerRig rig(hkv, Precision::cpu(dtype));
            EXPECT_EQ(rig.layer->head_max_logit(), std::vector<double>(4, -kInf)) << "before any forward";
            const std::vector<double> heads = rig.forward(), direct = rig.direct_head_max();
            ASSERT_EQ(heads.size(), 4u);
            const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
            for (size_t h = 0; h < 4; ++h) EXPECT_NEAR(heads[h], direct[h], tol * std::abs(direct[h])) << h;
            EXPECT_EQ(rig.layer->max_logit(), *std::max_element(heads.begin(), heads.end()));
            // Running maximum: a second forward with a smaller input keeps the first's maxima; reset clears them.
            const Tensor x = rig.x.clone();
            for (int64_t i = 0; i < rig.x.numel(); ++i)
                core::tensor_set_flat(rig.x, i, 0.5 * core::tensor_get_flat(x, i));
            rig.layer->forward(rig.x, rig.out);
            rig.layer->collect_max_logit();
            EXPECT_EQ(rig.layer->head_max_logit(), heads);
            rig.layer->reset_max_logit();
            EXPECT_EQ(rig.layer->head_max_logit(), std::vector<double>(4, -kInf));
            EXPECT_EQ(rig.layer->max_logit(), -kInf);
            const std::vector<double> smaller = rig.forward();
            for (size_t h = 0; h < 4; ++h) EXPECT_LT(smaller[h], heads[h]) << h;
            EXPECT_EQ(rig.layer->max_logit(), *std::max_element(smaller.begin(), smaller.end()));
        }
}

// §9 test 6 on one layer: `targets` maps the kv groups to inflate to their max logit (Wq and Wk rows of the group
// scaled by sqrt(target / S_g) each); the clip at tau = 100 brings each to tau (within `tol`: 1e-6 on the CPU), the
// other groups keep bitwise the same weights, per-head maxima and attention output.
void expect_clip_caps_the_groups(
    int64_t hkv, const std::map<int64_t, double>& targets, const Precision& precision, double alpha, double tol) {
    SCOPED_TRACE(fmt::format(
        "hkv {} {} on {} alpha {}", hkv, dtype_name(precision.compute), core::device_name(precision.device), alpha));
    constexpr double kTau = 100.0;
    LayerRig rig(hkv, precision);
    const int64_t d = rig.head_dim(), per_group = rig.cfg.n_heads / hkv;
    const int wq = rig.layer->wq_param(), wk = rig.layer->wk_param();
    ASSERT_EQ(rig.table.spec(wq).name, "attn.wq.weight");
    ASSERT_EQ(rig.table.spec(wk).name, "attn.wk.weight");
    const std::vector<double> initial = qk_clip_group_max(rig.forward(), rig.cfg.n_heads, hkv);
    for (const auto& [g, target] : targets) {
        ASSERT_GT(initial[static_cast<size_t>(g)], 0.1);
        const double c = std::sqrt(target / initial[static_cast<size_t>(g)]);
        scale_rows_by(rig.table, wq, g * per_group * d, (g + 1) * per_group * d, c);
        scale_rows_by(rig.table, wk, g * d, (g + 1) * d, c);
    }
    const std::vector<double> before = rig.forward();
    const Tensor attn_before = rig.attention_out();
    const std::vector<double> group_before = qk_clip_group_max(before, rig.cfg.n_heads, hkv);
    for (int64_t g = 0; g < hkv; ++g) {
        const double s = group_before[static_cast<size_t>(g)];
        if (targets.count(g))
            EXPECT_NEAR(s, targets.at(g), std::max(tol, 1e-5) * targets.at(g)) << g;
        else
            EXPECT_LT(s, kTau) << "group " << g << " starts below tau";
    }
    const QkClipFactors f = rig.layer->qk_clip_factors(kTau, alpha);
    EXPECT_TRUE(f.any);
    EXPECT_EQ(f.groups_clipped, static_cast<int64_t>(targets.size()));
    EXPECT_EQ(f.heads_clipped, static_cast<int64_t>(targets.size()) * per_group);
    const Tensor wq_before = rig.master_on_host(wq), wk_before = rig.master_on_host(wk);
    qk_clip_scale_rows(rig.table.master(wq), f.q_row_scale);
    qk_clip_scale_rows(rig.table.master(wk), f.k_row_scale);
    if (rig.precision.has_master_copy()) rig.table.refresh_params_from_master();
    const std::vector<double> after = rig.forward();
    const Tensor attn_after = rig.attention_out(), wq_after = rig.master_on_host(wq), wk_after = rig.master_on_host(wk);
    const std::vector<double> group_after = qk_clip_group_max(after, rig.cfg.n_heads, hkv);
    const size_t head_bytes = static_cast<size_t>(d) * core::dtype_size(attn_after.dtype());
    for (int64_t g = 0; g < hkv; ++g) {
        const bool clipped = targets.count(g) > 0;
        EXPECT_EQ(rows_equal(wk_after, wk_before, g * d, (g + 1) * d), !clipped || alpha == 1.0) << g;
        if (clipped) {
            EXPECT_LE(group_after[static_cast<size_t>(g)], kTau * (1.0 + tol)) << g;
            EXPECT_GE(group_after[static_cast<size_t>(g)], kTau * (1.0 - tol)) << g << ": the clip lands on tau";
        }
        for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
            EXPECT_EQ(rows_equal(wq_after, wq_before, h * d, (h + 1) * d), !clipped) << h;
            if (clipped) continue;
            EXPECT_EQ(after[static_cast<size_t>(h)], before[static_cast<size_t>(h)]) << "head " << h << " bitwise";
            for (int64_t bt = 0; bt < rig.batch * rig.seq; ++bt) {
                const size_t at = static_cast<size_t>(bt * rig.cfg.n_heads + h) * head_bytes;
                ASSERT_EQ(std::memcmp(static_cast<const char*>(attn_after.raw()) + at,
                                      static_cast<const char*>(attn_before.raw()) + at,
                                      head_bytes),
                          0)
                    << "head " << h << " row " << bt;
            }
        }
    }
    EXPECT_EQ(rig.layer->max_logit(), *std::max_element(after.begin(), after.end()));
    EXPECT_FALSE(rig.layer->qk_clip_factors(kTau * (1.0 + tol), alpha).any) << "a second clip has nothing to do";
}

TEST(QkClipLayer, GqaGroupAt400IsCappedAtTau) {
    for (DType dtype : {DType::f64, DType::f32})
        for (double alpha : {0.5, 1.0})
            expect_clip_caps_the_groups(2, {{0, 400.0}}, Precision::cpu(dtype), alpha, 1e-6);
}

TEST(QkClipLayer, MhaHeadsAt400And250AreCappedAtTau) {
    for (DType dtype : {DType::f64, DType::f32})
        for (double alpha : {0.5, 1.0})
            expect_clip_caps_the_groups(4, {{0, 400.0}, {2, 250.0}}, Precision::cpu(dtype), alpha, 1e-6);
}

// On the GPU in bf16 mixed precision: the f32 masters clipped on the device, the bf16 copy refreshed; the clipped
// groups land on tau up to the bf16 rounding of the weights (2e-2), the others stay bitwise. The per-head maxima
// equal the direct maximum over the saved bf16 q and k.
TEST(GpuQkClip, LayerClipInMixedPrecision) {
    if (!ops::test::op_gpu_available()) GTEST_SKIP() << ops::test::kOpNoGpuMessage;
    {
        LayerRig rig(2, Precision::cuda_bf16());
        const std::vector<double> heads = rig.forward(), direct = rig.direct_head_max();
        for (size_t h = 0; h < 4; ++h) EXPECT_NEAR(heads[h], direct[h], 1e-3 * std::abs(direct[h])) << h;
        EXPECT_EQ(rig.layer->max_logit(), *std::max_element(heads.begin(), heads.end()));
    }
    for (double alpha : {0.5, 1.0}) {
        expect_clip_caps_the_groups(2, {{0, 400.0}}, Precision::cuda_bf16(), alpha, 2e-2);
        expect_clip_caps_the_groups(4, {{0, 400.0}, {2, 250.0}}, Precision::cuda_bf16(), alpha, 2e-2);
    }
}

}  // namespace
}  // namespace mt::nn
