// Per-modality routing of the MoE layer (multimodal.md §4 and §9 test 4): with moe.modality_bias = "balanced" each
// modality's QB step has the exact-balance property of moe.md test 5 on its own tokens (and equals a balancer fed
// only those tokens, bit for bit), and the router selects on s + b_m; the per-modality metrics match hand-computed
// values on a scripted routing with capacity drops; the learned per-modality router offset c_m gets the gradient
// of fp64 central differences; "off" on an image + text model routes exactly as a text-only layer, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "core/rng.h"
#include "nn/layers/moe_layer.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

ModelConfig modality_model(int64_t d, bool vision) {
    ModelConfig c;
    c.d_model = d;
    c.n_layers = 2;
    c.init_std = 0.5;
    if (vision) {  // the layer takes token modalities when the model has a vision encoder
        c.vision.layers = 1;
        c.vision.image_token = 3;
    }
    return c;
}

MoeConfig modality_moe(MoeModalityBias bias, MoeBalanceMode mode = MoeBalanceMode::quantile) {
    MoeConfig m;
    m.num_experts = 8;
    m.top_k = 2;
    m.num_shared_experts = 1;
    m.expert_ffn_dim = 6;
    m.balance.mode = mode;
    m.balance.bins = 1000;
    m.modality_bias = bias;
    return m;
}

// Token i is an image token when image(i).
MoeModality modalities(int64_t n, const std::function<bool(int64_t)>& image) {
    Tensor t = Tensor::zeros({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = image(i) ? 1 : 0;
    return {t, t};
}

struct Layer {
    ParamTable table;
    MoeLayer layer;
    Workspace ws;
    Tensor x, out, r_out;
    Layer(const ModelConfig& model, const MoeConfig& moe, int64_t n, uint64_t seed, DType dtype = DType::f64)
        : layer(table, "layers.1.moe", model, moe) {
        const Precision p = Precision::cpu(dtype);
        table.finalize(p);
        table.initialize(seed);
        layer.resize(n, p);
        x = Tensor::zeros({n, model.d_model}, dtype);
        core::rng_fill_normal(x, seed, 1, 0.0, 1.0);
        out = Tensor::zeros({n, model.d_model}, dtype);
        r_out = Tensor::zeros({n, model.d_model}, dtype);
        core::rng_fill_normal(r_out, seed, 3, 0.0, 1.0);
    }
};

// The rows of scores [N, E] whose modality is m, and each row's cutoff: the (k+1)-th largest s + b_m.
struct ModalityRows {
    Tensor scores, cutoff;
};
ModalityRows modality_rows(
    const Tensor& scores, const MoeModality& mod, int32_t m, const std::vector<float>& bias, int64_t k) {
    const int64_t n = scores.size(0), e = scores.size(1);
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < n; ++i)
        if (mod.host.data<int32_t>()[i] == m) rows.push_back(i);
    ModalityRows r{Tensor::zeros({static_cast<int64_t>(rows.size()), e}, DType::f64),
                   Tensor::zeros({static_cast<int64_t>(rows.size())}, DType::f64)};
    std::vector<double> key(static_cast<size_t>(e));
    for (size_t q = 0; q < rows.size(); ++q) {
        for (int64_t j = 0; j < e; ++j) {
            const double s = core::tensor_get_flat(scores, rows[q] * e + j);
            core::tensor_set_flat(r.scores, static_cast<int64_t>(q) * e + j, s);
            key[static_cast<size_t>(j)] = s + static_cast<double>(bias[static_cast<size_t>(j)]);
        }
        std::sort(key.begin(), key.end(), std::greater<>());
        core::tensor_set_flat(r.cutoff, static_cast<int64_t>(q), key[static_cast<size_t>(k)]);
    }
    return r;
}

// #{i : r_ij < b_j} (or <= with inclusive) per expert, r_ij = cutoff_i - s_ij.
std::vector<int64_t> below(const ModalityRows& r, const std::vector<double>& b, bool inclusive = false) {
    const int64_t n = r.scores.size(0), e = r.scores.size(1);
    std::vector<int64_t> c(static_cast<size_t>(e), 0);
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < e; ++j) {
            const double rij = core::tensor_get_flat(r.cutoff, i) - core::tensor_get_flat(r.scores, i * e + j);
            c[static_cast<size_t>(j)] += inclusive ? rij <= b[static_cast<size_t>(j)] : rij < b[static_cast<size_t>(j)];
        }
    }
    return c;
}

// "balanced": two steps of 960 tokens (384 text, 576 image: T_m k / n = 96 and 144). At each, every modality's QB step
// satisfies moe.md test 5 on that modality's rows (the exact oracle balances them exactly; the histogram step is off
// by at most its bin's count) and equals the step of a balancer fed only those rows; the router picks the top k of
// s + b_m.
TEST(MoeModalityRouting, BalancedQuantileStepIsExactPerModality) {
    const int64_t n = 960, k = 2, e = 8;
    Layer l(modality_model(12, true), modality_moe(MoeModalityBias::balanced), n, 5);
    ASSERT_EQ(l.layer.num_balancers(), 2);
    const MoeModality mod = modalities(n, [](int64_t i) { return i % 5 >= 2; });  // 3 of every 5
    const MoeConfig cfg = modality_moe(MoeModalityBias::balanced);
    std::vector<MoeBalancer> alone(2, MoeBalancer(e, k, cfg.balance));  // fed only their modality's rows
    for (int step = 0; step < 2; ++step) {
        core::rng_fill_normal(l.x, 40 + step, 1, 0.0, 1.0);
        l.layer.set_modality(mod);
        std::array<std::vector<float>, 2> bias = {l.layer.balancer(0).bias(), l.layer.balancer(1).bias()};
        l.layer.forward(l.x, l.out, true);
        // the selection: top k of s + b_m for a token of modality m (ties are measure zero with these inputs)
        const Tensor s = l.layer.scores(), idx = l.layer.indices();
        for (int64_t i = 0; i < n; ++i) {
            const auto& b = bias[static_cast<size_t>(mod.host.data<int32_t>()[i])];
            std::vector<int32_t> order(e);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int32_t a, int32_t c) {
                return core::tensor_get_flat(s, i * e + a) + b[a] > core::tensor_get_flat(s, i * e + c) + b[c];
            });
            for (int64_t q = 0; q < k; ++q) ASSERT_EQ(idx.data<int32_t>()[i * k + q], order[q]) << "token " << i;
        }
        std::array<ModalityRows, 2> rows;
        for (int32_t m = 0; m < 2; ++m) {
            rows[m] = modality_rows(s, mod, m, bias[static_cast<size_t>(m)], k);
            alone[m].observe(rows[m].scores, rows[m].cutoff, Tensor::zeros({rows[m].scores.size(0), k}, DType::i32));
        }
        l.layer.step_end(step);
        for (int32_t m = 0; m < 2; ++m) {
            const int64_t t_m = rows[m].scores.size(0), target = t_m * k / e;
            ASSERT_EQ(t_m * k % e, 0);
            // The sort-based oracle on the modality's own rows balances them exactly, up to the structural ties of
            // moe.md test 5: token i's (k+1)-th expert j has r_ij = b_j (old) exactly, so when rank T_m k / n falls
            // inside that block the strict and the inclusive counts bracket it.
            const std::vector<double> exact = moe_qb_exact_bias(rows[m].scores, rows[m].cutoff, k);
            const std::vector<int64_t> lo = below(rows[m], exact), hi = below(rows[m], exact, true);
            for (int64_t j = 0; j < e; ++j)
                EXPECT_TRUE(lo[j] == target || (lo[j] < target && hi[j] >= target))
                    << "modality " << m << " expert " << j << " step " << step << ": " << lo[j] << ".." << hi[j];
            // the histogram step: off by at most the count of its bin
            const MoeBalancer& b = l.layer.balancer(m);
            const std::vector<int64_t> got = below(rows[m], b.last_quantile_target());
            for (int64_t j = 0; j < e; ++j)
                EXPECT_LE(std::llabs(got[j] - target), static_cast<long long>(b.last_quantile_bin_count()[j]))
                    << "modality " << m << " expert " << j << " step " << step;
            // the same state as a balancer that saw only these rows
            alone[m].step();
            EXPECT_EQ(b.bias(), alone[m].bias()) << "modality " << m << " step " << step;
            EXPECT_EQ(b.lower(), alone[m].lower());
            EXPECT_EQ(b.upper(), alone[m].upper());
            EXPECT_LE(std::fabs(std::accumulate(b.bias().begin(), b.bias().end(), 0.0)) / e, 1e-7);
        }
        EXPECT_NE(l.layer.balancer(0).bias(), l.layer.balancer(1).bias());
    }
    // The state round-trips: the image balancer's tensors under "{prefix}.router.image".
    std::vector<std::string> names;
    for (const auto& [name, t] : l.layer.state_tensors()) names.push_back(name);
    EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.moe.router.bias"), names.end());
    EXPECT_NE(std::find(names.begin(), names.end(), "layers.1.moe.router.image.qb_hist"), names.end());
    Layer r(modality_model(12, true), modality_moe(MoeModalityBias::balanced), n, 5);
    r.layer.load_state_tensors(l.layer.state_tensors());
    r.layer.load_state_json(l.layer.state_json());
    EXPECT_EQ(r.layer.state_json(), l.layer.state_json());
    EXPECT_EQ(r.layer.balancer(1).bias(), l.layer.balancer(1).bias());
}

// A scripted routing: the router weight 10 I sends token i (x_i = e_{t_i}) to expert t_i (k = 1). 8 tokens, 4
// experts, capacity 1 row per expert (CF 0.5, keep the first in token order). Text tokens 0, 2, 6 to experts 0, 0, 3;
// image tokens 1, 3, 4, 5, 7 to experts 0, 1, 2, 0, 2.
TEST(MoeModalityMetrics, ScriptedRoutingWithDrops) {
    const int64_t n = 8, e = 4, c = 4;
    MoeConfig moe;
    moe.num_experts = e;
    moe.top_k = 1;
    moe.num_shared_experts = 0;
    moe.expert_ffn_dim = 3;
    moe.balance.mode = MoeBalanceMode::none;
    moe.capacity_factor = 0.5;
    moe.drop_policy = ops::MoeDropPolicy::position;
    Layer l(modality_model(c, true), moe, n, 3);
    const int param = l.table.find("layers.1.moe.router.weight");
    ASSERT_GE(param, 0);
    const Tensor w = l.table.param(param);
    w.zero();
    for (int64_t j = 0; j < e; ++j) core::tensor_set_flat(w, j * c + j, 10.0);
    const int32_t target[] = {0, 0, 0, 1, 2, 0, 3, 2};
    l.x.zero();
    for (int64_t i = 0; i < n; ++i) core::tensor_set_flat(l.x, i * c + target[i], 1.0);
    const MoeModality mod = modalities(n, [](int64_t i) { return i != 0 && i != 2 && i != 6; });
    l.layer.set_modality(mod);
    l.layer.forward(l.x, l.out, true);
    const MoeStepMetrics m = l.layer.step_end(0);
    ASSERT_EQ(m.modality.size(), 2u);
    const MoeModalityMetrics &text = m.modality[0], &image = m.modality[1];
    EXPECT_EQ(text.load, (std::vector<int64_t>{2, 0, 0, 1}));
    EXPECT_EQ(image.load, (std::vector<int64_t>{2, 1, 2, 0}));
    EXPECT_EQ(text.tokens, 3);
    EXPECT_EQ(image.tokens, 5);
    EXPECT_DOUBLE_EQ(text.token_share, 3.0 / 8);
    EXPECT_DOUBLE_EQ(image.token_share, 5.0 / 8);
    // f = load / (T_m k / n): text (8/3, 0, 0, 4/3), image (1.6, 0.8, 1.6, 0)
    EXPECT_NEAR(text.max_vio, 8.0 / 3 - 1, 1e-15);
    EXPECT_NEAR(text.load_var, (25.0 / 9 + 1 + 1 + 1.0 / 9) / 4, 1e-15);
    EXPECT_NEAR(image.max_vio, 0.6, 1e-15);
    EXPECT_NEAR(image.load_var, (0.36 + 0.04 + 0.36 + 1) / 4, 1e-15);
    // capacity 1: expert 0 keeps token 0 (text) and drops 1, 2, 5; expert 2 keeps 4 and drops 7
    EXPECT_EQ(text.dropped, 1);
    EXPECT_EQ(image.dropped, 3);
    EXPECT_DOUBLE_EQ(text.drop_rate, 1.0 / 3);
    EXPECT_DOUBLE_EQ(image.drop_rate, 3.0 / 5);
    EXPECT_EQ(m.dropped, 4);
    // phi_j = image rows / rows: 2/4, 1/1, 2/2, 0/1 -> sorted 0, 0.5, 1, 1
    EXPECT_DOUBLE_EQ(m.image_share, 5.0 / 8);
    const std::array<double, 5> phi = {0.0, 0.15, 0.75, 1.0, 1.0};
    for (size_t q = 0; q < phi.size(); ++q) EXPECT_NEAR(m.expert_image_share[q], phi[q], 1e-15) << q;
    // the JSONL fields, with the per-expert loads and drop rates on request
    const nlohmann::json j = m.modality_json(true, true);
    EXPECT_EQ(j.at("modality/image/load"), nlohmann::json(image.load));
    EXPECT_DOUBLE_EQ(j.at("modality/text/drop_rate").get<double>(), 1.0 / 3);
    EXPECT_DOUBLE_EQ(j.at("expert_image_share_p50").get<double>(), 0.75);
    EXPECT_FALSE(m.modality_json(false, false).contains("modality/text/load"));
    EXPECT_FALSE(m.modality_json(false, false).contains("modality/text/drop_rate"));
    // too few rows per expert (T_m k / n < 32) for the per-modality alarm to judge
    EXPECT_TRUE(l.layer.last_modality_alarms().empty());
}

// The per-modality collapse alarm: zero router weights tie every expert, so every token of either modality goes to
// experts 0 and 1 (load_var 1 on each modality's own rows); with 128 tokens each (T_m k / n = 64 >= 32) both
// modalities alarm after the window, each event naming its modality, beside the layer-wide alarm.
TEST(MoeModalityMetrics, CollapseAlarmPerModality) {
    const int64_t n = 256, e = 4;
    MoeConfig moe = modality_moe(MoeModalityBias::off, MoeBalanceMode::none);
    moe.num_experts = e;
    moe.alarm.start_step = 0;
    moe.alarm.window = 2;
    Layer l(modality_model(6, true), moe, n, 7);
    l.table.param(l.table.find("layers.1.moe.router.weight")).zero();
    const MoeModality mod = modalities(n, [](int64_t i) { return i % 2 == 1; });  // 128 each: T_m k / n = 64
    std::vector<MoeCollapseEvent> events;
    for (int step = 0; step < 2; ++step) {
        l.layer.set_modality(mod);
        l.layer.forward(l.x, l.out, true);
        l.layer.step_end(step);
        events.insert(events.end(), l.layer.last_modality_alarms().begin(), l.layer.last_modality_alarms().end());
    }
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].modality, "text");
    EXPECT_EQ(events[1].modality, "image");
    EXPECT_EQ(events[0].to_json().at("modality"), "text");
    EXPECT_NE(events[1].message().find("image tokens"), std::string::npos) << events[1].message();
    ASSERT_TRUE(l.layer.last_alarm().has_value());  // and the layer-wide one
}

// "learned": z = W_r x + c_m. The gradient of c against five-point central differences (fp64), each element alone,
// with the routing held (inputs away from top-k ties).
TEST(MoeModalityRouting, LearnedBiasGradientMatchesFiniteDifferences) {
    const int64_t n = 24, e = 8;
    Layer l(modality_model(8, true), modality_moe(MoeModalityBias::learned), n, 11);
    const int c = l.table.find("layers.1.moe.router.modality_bias");
    ASSERT_GE(c, 0);
    EXPECT_EQ(l.table.param(c).shape(), core::Shape({kMoeModalities, e}));
    EXPECT_FALSE(l.table.spec(c).weight_decay);
    EXPECT_EQ(l.table.spec(c).group, OptimGroup::adamw);
    for (int64_t i = 0; i < l.table.param(c).numel(); ++i)
        EXPECT_EQ(core::tensor_get_flat(l.table.param(c), i), 0.0) << "c starts at 0";
    core::rng_fill_normal(l.table.param(c), 77, 1, 0.0, 0.5);
    const MoeModality mod = modalities(n, [](int64_t i) { return i % 3 == 0; });
    l.layer.set_modality(mod);
    auto loss = [&] {
        l.layer.forward(l.x, l.out, false);
        long double s = 0;
        for (int64_t i = 0; i < l.out.numel(); ++i)
            s += static_cast<long double>(core::tensor_get_flat(l.out, i)) * core::tensor_get_flat(l.r_out, i);
        return s;
    };
    auto routing = [&] {
        const Tensor idx = l.layer.indices();
        return std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + idx.numel());
    };
    l.table.zero_grads();
    loss();
    const std::vector<int32_t> held = routing();
    const Tensor dx = Tensor::zeros(l.x.shape(), DType::f64);
    l.layer.backward(l.x, l.r_out, dx, l.ws);
    const Tensor w = l.table.param(c), g = l.table.grad(c).clone();
    const double h = 1e-6;
    double worst = 0;
    std::array<int, kMoeModalities> nonzero = {};
    for (int64_t i = 0; i < w.numel(); ++i) {
        const double orig = core::tensor_get_flat(w, i);
        auto at = [&](double step) {
            core::tensor_set_flat(w, i, orig + step * h);
            const long double v = loss();
            EXPECT_EQ(routing(), held) << "the routing changed under a perturbation of c[" << i << "]";
            return v;
        };
        const long double d1 = at(1) - at(-1), d2 = at(2) - at(-2);
        core::tensor_set_flat(w, i, orig);
        const double fd = static_cast<double>((8 * d1 - d2) / (12 * h)), an = core::tensor_get_flat(g, i);
        const double err = std::fabs(fd - an) / std::max({std::fabs(fd), std::fabs(an), 1e-8});
        worst = std::max(worst, err);
        EXPECT_LE(err, 1e-6) << "c[" << i / e << "][" << i % e << "]: fd " << fd << " analytic " << an;
        nonzero[static_cast<size_t>(i / e)] += an != 0.0;
    }
    EXPECT_GT(nonzero[0], 0) << "the text offsets get no gradient";  // an expert no token of m picked gets none
    EXPECT_GT(nonzero[1], 0) << "the image offsets get no gradient";
    std::printf("[ MOE MODALITY ] learned c: worst finite-difference error %.3e over %ld elements\n",
                worst,
                static_cast<long>(w.numel()));
}

// "off" on a layer that takes modalities routes, balances and computes exactly as a layer without them: outputs,
// gradients and the QB bias over three training steps, bit for bit. And "balanced" with every token text is the same.
TEST(MoeModalityRouting, OffAndAllTextBalancedEqualTheTextOnlyLayerBitwise) {
    const int64_t n = 40;
    Layer plain(modality_model(8, false), modality_moe(MoeModalityBias::off), n, 13);
    Layer off(modality_model(8, true), modality_moe(MoeModalityBias::off), n, 13);
    Layer text(modality_model(8, true), modality_moe(MoeModalityBias::balanced), n, 13);
    EXPECT_FALSE(plain.layer.per_modality());
    EXPECT_TRUE(off.layer.per_modality());
    const MoeModality mixed = modalities(n, [](int64_t i) { return i % 4 == 0; });
    const MoeModality all_text = modalities(n, [](int64_t) { return false; });
    auto same = [](const Tensor& a, const Tensor& b) {
        return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    };
    for (int step = 0; step < 3; ++step) {
        off.layer.set_modality(mixed);
        text.layer.set_modality(all_text);
        std::vector<Tensor> dx;
        for (Layer* l : {&plain, &off, &text}) {
            core::rng_fill_normal(l->x, 60 + step, 1, 0.0, 1.0);
            l->table.zero_grads();
            l->layer.forward(l->x, l->out, true);
            dx.push_back(Tensor::zeros(l->x.shape(), DType::f64));
            l->layer.backward(l->x, l->r_out, dx.back(), l->ws);
            l->layer.step_end(step);
        }
        for (Layer* l : {&off, &text}) {
            EXPECT_TRUE(same(l->out, plain.out)) << "step " << step;
            for (int i = 0; i < plain.table.size(); ++i)
                EXPECT_TRUE(same(l->table.grad(i), plain.table.grad(i))) << plain.table.spec(i).name;
            EXPECT_EQ(l->layer.balancer().bias(), plain.layer.balancer().bias()) << "step " << step;
        }
        EXPECT_TRUE(same(dx[1], dx[0]));
        EXPECT_TRUE(same(dx[2], dx[0]));
    }
}

}  // namespace
}  // namespace mt::nn
