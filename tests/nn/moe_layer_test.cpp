// The MoE layer (nn/layers/moe_layer.h) in f64: finite-difference checks of every parameter and the input with the
// routing held fixed (inputs away from top-k ties; each evaluation checks that the routing did not change), for QB bias
// with normalised gates and two shared experts, the aux loss with unnormalised gates, and softmax scores with capacity
// dropping; the collapse alarm on a forced collapse and its silence on a balanced run; shapes and contract errors;
// and the dump the PyTorch parity script reads (MoeLayerParity.Dump, which runs only when MT_MOE_PARITY_DIR names a
// directory; tests/scripts/moe_parity.sh sets it).
#include "nn/layers/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>

#include "core/rng.h"
#include "train/safetensors.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

ModelConfig small_model(int64_t d) {
    ModelConfig c;
    c.d_model = d;
    c.n_layers = 2;
    c.init_std = 0.5;  // large enough that every path carries gradient and the router's scores are spread
    return c;
}

MoeConfig small_moe(MoeBalanceMode mode) {
    MoeConfig m;
    m.num_experts = 6;
    m.top_k = 2;
    m.num_shared_experts = 2;
    m.expert_ffn_dim = 5;
    m.routed_scale = 2.5;
    m.balance.mode = mode;
    m.balance.bins = 100;
    m.balance.aux_coeff = 0.3;  // large, so that its gradient is visible next to the output's
    return m;
}

// A layer with its parameters, input and loss weights.
struct Fixture {
    ModelConfig cfg;
    ParamTable table;
    MoeLayer layer;
    Workspace ws;
    int64_t n;
    Tensor x, r_out, out;

    Fixture(const ModelConfig& model, const MoeConfig& moe, DType dtype, int64_t n_, uint64_t seed)
        : cfg(model), layer(table, "layers.1.moe", model, moe), n(n_) {
        const Precision precision = Precision::cpu(dtype);
        table.finalize(precision);
        table.initialize(seed);
        layer.resize(n, precision);
        x = Tensor::zeros({n, model.d_model}, dtype);
        core::rng_fill_normal(x, seed, 1, 0.0, 1.0);
        r_out = Tensor::zeros({n, model.d_model}, dtype);
        core::rng_fill_normal(r_out, seed, 3, 0.0, 1.0);
        out = Tensor::zeros({n, model.d_model}, dtype);
    }

    // L = sum(out * R) + aux_loss, and |terms| summed (the rounding scale of L). An eval forward: the balancer
    // state does not move.
    double loss(double* abs_sum = nullptr) {
        layer.forward(x, out, false);
        long double l = layer.aux_loss(), a = std::fabs(layer.aux_loss());
        for (int64_t i = 0; i < out.numel(); ++i) {
            const long double term =
                static_cast<long double>(core::tensor_get_flat(out, i)) * core::tensor_get_flat(r_out, i);
            l += term;
            a += std::fabs(term);
        }
        if (abs_sum) *abs_sum = static_cast<double>(a);
        return static_cast<double>(l);
    }

    Tensor backward() {
        table.zero_grads();
        loss();
        const Tensor dx = Tensor::zeros(x.shape(), x.dtype());
        layer.backward(x, r_out, dx, ws);
        return dx;
    }

    // The routing of the last forward, as bytes (the indices and the number of rows kept).
    std::vector<char> routing() const {
        const Tensor idx = layer.indices();
        const char* p = static_cast<const char*>(idx.raw());
        std::vector<char> b(p, p + idx.nbytes());
        const int64_t kept = layer.rows_kept();
        b.insert(b.end(), reinterpret_cast<const char*>(&kept), reinterpret_cast<const char*>(&kept) + sizeof kept);
        return b;
    }
};

// The smallest gap between adjacent biased scores among each row's top K + 1 (the margin of the top-k choice).
double min_topk_gap(const Tensor& scores, const std::vector<float>& bias, int64_t k, bool use_bias) {
    const int64_t n = scores.size(0), e = scores.size(1);
    double gap = 1e300;
    std::vector<double> key(static_cast<size_t>(e));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < e; ++j)
            key[static_cast<size_t>(j)] =
                core::tensor_get_flat(scores, i * e + j) + (use_bias ? bias[static_cast<size_t>(j)] : 0.0);
        std::sort(key.begin(), key.end(), std::greater<>());
        for (int64_t q = 0; q < std::min(k, e - 1); ++q)
            gap = std::min(gap, key[static_cast<size_t>(q)] - key[static_cast<size_t>(q + 1)]);
    }
    return gap;
}

// Five-point directional finite difference of L along dir for tensor w (perturbed in place) against grad; the routing
// must stay as `routing` at every evaluation.
double fd_error(Fixture& f,
                const Tensor& w,
                const Tensor& grad,
                const Tensor& dir,
                double noise,
                const std::vector<char>& routing) {
    double max_abs = 0;
    for (int64_t i = 0; i < w.numel(); ++i) max_abs = std::max(max_abs, std::fabs(core::tensor_get_flat(w, i)));
    const double h = 1e-6 * std::max(1.0, max_abs);
    const Tensor orig = w.clone();
    long double analytic = 0;
    for (int64_t i = 0; i < w.numel(); ++i)
        analytic += static_cast<long double>(core::tensor_get_flat(grad, i)) * core::tensor_get_flat(dir, i) * 2 * h;
    auto loss_at = [&](double step) {
        for (int64_t i = 0; i < w.numel(); ++i)
            core::tensor_set_flat(w, i, core::tensor_get_flat(orig, i) + step * h * core::tensor_get_flat(dir, i));
        const long double l = f.loss();
        EXPECT_TRUE(f.routing() == routing) << "the routing changed under a perturbation";
        return l;
    };
    const long double d1 = loss_at(1) - loss_at(-1), d2 = loss_at(2) - loss_at(-2);
    w.copy_from(orig);
    const double fd = static_cast<double>((8 * d1 - d2) / 6), an = static_cast<double>(analytic);
    const double denom = std::max({std::fabs(fd), std::fabs(an), 3 * noise / 1e-6, 1e-300});
    return std::fabs(fd - an) / denom;
}

void check_layer_grads(const char* label, MoeConfig moe, const std::vector<float>& bias) {
    Fixture f(small_model(8), moe, DType::f64, 24, 11);
    if (!bias.empty()) f.layer.balancer().set_bias(bias);
    const Tensor dx = f.backward();
    const std::vector<char> routing = f.routing();
    const bool use_bias = moe.balance.mode == MoeBalanceMode::quantile || moe.balance.mode == MoeBalanceMode::sign_bias;
    const double gap = min_topk_gap(f.layer.scores(), f.layer.balancer().bias(), moe.top_k, use_bias);
    EXPECT_GE(gap, 1e-4) << "inputs too close to a top-k tie for finite differences";
    double abs_sum = 0;
    f.loss(&abs_sum);
    const double noise = 64 * 2.2e-16 * abs_sum;
    std::vector<std::pair<std::string, std::pair<Tensor, Tensor>>> targets;  // name -> (value, grad)
    for (int i = 0; i < f.table.size(); ++i)
        targets.push_back({f.table.spec(i).name, {f.table.param(i), f.table.grad(i).clone()}});
    targets.push_back({"x", {f.x, dx}});
    double worst = 0;
    for (size_t t = 0; t < targets.size(); ++t) {
        const auto& [name, vg] = targets[t];
        for (int probe = 0; probe < 5; ++probe) {
            Tensor dir = Tensor::zeros(vg.first.shape(), DType::f64);
            if (probe < 2) {
                core::rng_fill_normal(dir, 91, 16 * t + probe, 0.0, 1.0);
            } else {
                const int64_t i =
                    static_cast<int64_t>(core::rng_u64(92, t, probe) % static_cast<uint64_t>(dir.numel()));
                core::tensor_set_flat(dir, i, 1.0);
            }
            const double err = fd_error(f, vg.first, vg.second, dir, noise, routing);
            worst = std::max(worst, err);
            EXPECT_LE(err, 1e-6) << label << ": " << name << " probe " << probe;
        }
    }
    std::printf(
        "[ MOE LAYER ] %s: worst finite-difference error %.3e over %zu tensors (min top-k gap %.2e, %ld of %ld "
        "rows kept)\n",
        label,
        worst,
        targets.size(),
        gap,
        static_cast<long>(f.layer.rows_kept()),
        static_cast<long>(f.n * moe.top_k));
    testing::Test::RecordProperty("worst_rel_error", fmt::format("{:.3e}", worst));
}

TEST(MoeLayerGrad, QuantileBiasNormalizedTwoShared) {
    check_layer_grads("quantile bias, normalised gates, 2 shared",
                      small_moe(MoeBalanceMode::quantile),
                      {0.05f, -0.1f, 0.02f, 0.08f, -0.03f, -0.02f});
}

TEST(MoeLayerGrad, AuxLossUnnormalized) {
    MoeConfig moe = small_moe(MoeBalanceMode::aux_loss);
    moe.normalize_gates = false;
    moe.num_shared_experts = 1;
    check_layer_grads("aux loss, unnormalised gates, 1 shared", moe, {});
}

TEST(MoeLayerGrad, SoftmaxCapacityDropNoShared) {
    MoeConfig moe = small_moe(MoeBalanceMode::aux_loss);
    moe.score = ops::MoeScore::softmax;
    moe.num_shared_experts = 0;
    moe.capacity_factor = 0.8;  // C = ceil(24 * 2 / 6 * 0.8) = 7 rows per expert: some drop
    moe.routed_scale = 1.0;
    check_layer_grads("softmax, aux loss, capacity 0.8 (probs), no shared", moe, {});
}

TEST(MoeLayerShapes, ParametersSavedTensorsAndErrors) {
    Fixture f(small_model(8), small_moe(MoeBalanceMode::quantile), DType::f32, 5, 3);
    f.loss();
    EXPECT_EQ(f.table.spec(f.table.find("layers.1.moe.router.weight")).shape, (core::Shape{6, 8}));
    EXPECT_EQ(f.table.spec(f.table.find("layers.1.moe.experts.w_gate")).shape, (core::Shape{6, 5, 8}));
    EXPECT_EQ(f.table.spec(f.table.find("layers.1.moe.experts.w_down")).shape, (core::Shape{6, 8, 5}));
    EXPECT_EQ(f.table.spec(f.table.find("layers.1.moe.shared.w_up.weight")).shape, (core::Shape{10, 8}));
    EXPECT_GT(saved_bytes(f.layer.saved_for_backward()), 0u);
    EXPECT_EQ(f.layer.rows_kept(), 10);
    // a training step with capacity 0.5: C = ceil(5 * 2 / 6 * 0.5) = 1 row per expert, so at least 4 of 10 rows drop
    MoeConfig capped = small_moe(MoeBalanceMode::quantile);
    capped.capacity_factor = 0.5;
    Fixture g(small_model(8), capped, DType::f32, 5, 3);
    g.layer.forward(g.x, g.out, true);
    const MoeStepMetrics m = g.layer.step_end(0);
    int64_t rows = 0;
    for (int64_t c : m.load) rows += c;
    EXPECT_EQ(rows, 10);  // loads count the router's pre-drop choices
    EXPECT_LE(g.layer.rows_kept(), 6);
    EXPECT_DOUBLE_EQ(m.drop_rate, static_cast<double>(10 - g.layer.rows_kept()) / 10.0);
    EXPECT_EQ(g.layer.balancer().updates(), 1);
    std::vector<std::string> names;
    for (const auto& [name, t] : g.layer.state_tensors()) names.push_back(name);
    Fixture h(small_model(8), capped, DType::f32, 5, 3);
    h.layer.load_state_tensors(g.layer.state_tensors());
    h.layer.load_state_json(g.layer.state_json());
    EXPECT_EQ(h.layer.state_json(), g.layer.state_json());
    EXPECT_EQ(h.layer.balancer().bias(), g.layer.balancer().bias());
    EXPECT_EQ(names,
              (std::vector<std::string>{"layers.1.moe.router.bias",
                                        "layers.1.moe.router.loads",
                                        "layers.1.moe.router.counters",
                                        "layers.1.moe.router.qb_bounds",
                                        "layers.1.moe.router.qb_hist"}));
    // A config that breaks the layer's contract (the parser rejects it first, with exit 2) is a caller's bug: exit 1.
    auto expect_contract_error = [](MoeConfig moe, const std::string& needle) {
        ParamTable t;
        try {
            MoeLayer l(t, "m", small_model(8), moe);
            ADD_FAILURE() << "expected an error containing " << needle;
        } catch (const core::Error& e) {
            EXPECT_EQ(e.code(), core::ExitCode::internal) << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    MoeConfig bad = small_moe(MoeBalanceMode::quantile);
    bad.num_experts = 1025;
    expect_contract_error(bad, "moe.num_experts = 1025 must be in [1, 1024]");
    bad = small_moe(MoeBalanceMode::quantile);
    bad.top_k = 6;
    expect_contract_error(bad, "needs num_experts > top_k");
    bad.balance.mode = MoeBalanceMode::none;
    ParamTable other;
    MoeLayer ok(other, "other", small_model(8), bad);  // top_k = n is fine without a bias method
}

// The largest supported expert count: 1024 experts, top 8, a QB step; every gradient finite and the loads complete.
TEST(MoeLayerShapes, ThousandTwentyFourExperts) {
    MoeConfig moe = small_moe(MoeBalanceMode::quantile);
    moe.num_experts = 1024;
    moe.top_k = 8;
    moe.expert_ffn_dim = 2;
    Fixture f(small_model(4), moe, DType::f32, 257, 9);
    f.layer.forward(f.x, f.out, true);
    const Tensor dx = Tensor::zeros(f.x.shape(), DType::f32);
    f.layer.backward(f.x, f.r_out, dx, f.ws);
    const MoeStepMetrics m = f.layer.step_end(0);
    int64_t rows = 0;
    for (int64_t c : m.load) rows += c;
    EXPECT_EQ(rows, 257 * 8);
    EXPECT_EQ(f.layer.rows_kept(), 257 * 8);
    for (const Tensor& t : {f.out, dx, f.table.grad_arena()})
        for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isfinite(core::tensor_get_flat(t, i)));
    EXPECT_GT(m.bias_range, 0.0);
    EXPECT_LE(
        std::fabs(std::accumulate(f.layer.balancer().bias().begin(), f.layer.balancer().bias().end(), 0.0)) / 1024,
        1e-7);
}

// Router weights of zero give every expert the same score, so ties send every token to experts 0..k-1: a collapse.
// With balance "none" nothing corrects it, and the alarm must fire within window + 1 steps of start_step; a QB run
// on random weights and fresh tokens each step must raise none.
TEST(MoeLayerCollapse, ForcedCollapseFiresBalancedRunDoesNot) {
    auto run = [](MoeBalanceMode mode, bool collapse, int64_t steps, int64_t* first_alarm, MoeStepMetrics* last) {
        MoeConfig moe = small_moe(mode);
        moe.num_experts = 8;
        moe.alarm.start_step = 5;
        moe.alarm.window = 10;
        Fixture f(small_model(8), moe, DType::f32, 64, 5);
        if (collapse) {
            f.table.master(f.table.find("layers.1.moe.router.weight")).zero();
            f.table.refresh_params_from_master();
        }
        *first_alarm = -1;
        for (int64_t step = 0; step < steps; ++step) {
            core::rng_fill_normal(f.x, 100 + static_cast<uint64_t>(step), 1, 0.0, 1.0);
            f.layer.forward(f.x, f.out, true);
            *last = f.layer.step_end(step);
            if (f.layer.last_alarm() && *first_alarm < 0) {
                *first_alarm = step;
                std::printf("[ MOE ALARM ] %s\n", f.layer.last_alarm()->message().c_str());
            }
        }
        return f.layer.collapse_detector().alarms_total();
    };
    int64_t first = -1;
    MoeStepMetrics m;
    EXPECT_GE(run(MoeBalanceMode::none, true, 20, &first, &m), 1);
    EXPECT_GE(first, 5);
    EXPECT_LE(first, 5 + 10);  // start_step + window - 1 is the first step that can fire
    EXPECT_GT(m.load_var, 0.1);
    std::printf("[ MOE ALARM ] forced collapse: first alarm at step %ld, load_var %.3f, n_eff %.2f of 8\n",
                static_cast<long>(first),
                m.load_var,
                m.n_eff);
    EXPECT_EQ(run(MoeBalanceMode::quantile, false, 40, &first, &m), 0);
    std::printf("[ MOE ALARM ] balanced QB run: no alarm in 40 steps, last load_var %.4f, max_vio %.3f\n",
                m.load_var,
                m.max_vio);
    EXPECT_LT(m.load_var, 0.1);
}

// Writes layer evaluations (parameters, balancer bias, input, loss weights, outputs, routing, every gradient, and a
// QB update) for tests/scripts/moe_parity.sh, in f64 and f32, for three configurations.
TEST(MoeLayerParity, Dump) {
    const char* dir = std::getenv("MT_MOE_PARITY_DIR");
    if (!dir) GTEST_SKIP() << "MT_MOE_PARITY_DIR is not set (tests/scripts/moe_parity.sh sets it)";
    struct Variant {
        std::string name;
        MoeConfig moe;
    };
    std::vector<Variant> variants;
    {
        MoeConfig m = small_moe(MoeBalanceMode::quantile);
        m.num_experts = 16, m.top_k = 4, m.expert_ffn_dim = 12, m.num_shared_experts = 1;
        m.balance.bins = 1000;
        variants.push_back({"quantile", m});
        m.balance.mode = MoeBalanceMode::aux_loss;
        m.normalize_gates = false;
        m.routed_scale = 1.0;
        m.num_shared_experts = 2;
        m.balance.aux_coeff = 0.01;
        variants.push_back({"aux_loss", m});
        m = small_moe(MoeBalanceMode::sign_bias);
        m.num_experts = 16, m.top_k = 4, m.expert_ffn_dim = 12, m.num_shared_experts = 1;
        m.capacity_factor = 1.0;
        m.balance.sign_rate = 0.05;
        variants.push_back({"capacity", m});
    }
    for (const Variant& v : variants) {
        for (DType dtype : {DType::f64, DType::f32}) {
            Fixture f(small_model(24), v.moe, dtype, 96, 29);
            // one training step on other tokens first, so that the selection bias is not zero
            const Tensor x0 = f.x.clone();
            core::rng_fill_normal(f.x, 77, 1, 0.0, 1.0);
            f.layer.forward(f.x, f.out, true);
            f.layer.step_end(0);
            f.x.copy_from(x0);
            Tensor bias = Tensor::zeros({v.moe.num_experts}, DType::f32);
            std::copy(f.layer.balancer().bias().begin(), f.layer.balancer().bias().end(), bias.data<float>());
            // the dumped evaluation: a training forward (QB counts it), backward, then the balancer's update
            f.table.zero_grads();
            f.layer.forward(f.x, f.out, true);
            const Tensor dx = Tensor::zeros(f.x.shape(), dtype);
            f.layer.backward(f.x, f.r_out, dx, f.ws);
            const Tensor aux = Tensor::zeros({1}, dtype);
            aux.fill(f.layer.aux_loss());
            const Tensor idx = f.layer.indices().clone(), gates = f.layer.gates().clone();
            f.layer.step_end(1);
            Tensor bias_after = Tensor::zeros({v.moe.num_experts}, DType::f32);
            std::copy(f.layer.balancer().bias().begin(), f.layer.balancer().bias().end(), bias_after.data<float>());
            std::vector<std::pair<std::string, Tensor>> tensors = {{"x", f.x},
                                                                   {"r_out", f.r_out},
                                                                   {"bias", bias},
                                                                   {"bias_after", bias_after},
                                                                   {"out", f.out},
                                                                   {"aux_loss", aux},
                                                                   {"indices", idx},
                                                                   {"gates", gates},
                                                                   {"dx", dx}};
            for (int i = 0; i < f.table.size(); ++i) {
                tensors.push_back({"param/" + f.table.spec(i).name, f.table.param(i)});
                tensors.push_back({"grad/" + f.table.spec(i).name, f.table.grad(i)});
            }
            const MoeConfig& m = v.moe;
            const std::map<std::string, std::string> meta = {
                {"format", "moetrain-moe-parity"},
                {"prefix", "layers.1.moe"},
                {"num_experts", std::to_string(m.num_experts)},
                {"top_k", std::to_string(m.top_k)},
                {"num_shared_experts", std::to_string(m.num_shared_experts)},
                {"score", enum_name(m.score)},
                {"normalize_gates", m.normalize_gates ? "true" : "false"},
                {"routed_scale", fmt::format("{}", m.routed_scale)},
                {"capacity_factor", fmt::format("{}", m.capacity_factor)},
                {"drop_policy", enum_name(m.drop_policy)},
                {"balance", enum_name(m.balance.mode)},
                {"bins", std::to_string(m.balance.bins)},
                {"ema", fmt::format("{}", m.balance.ema)},
                {"sign_rate", fmt::format("{}", m.balance.sign_rate)},
                {"aux_coeff", fmt::format("{}", m.balance.aux_coeff)},
            };
            const std::string path = fmt::format("{}/moe_{}_{}.safetensors", dir, v.name, core::dtype_name(dtype));
            train::safetensors_write(path, tensors, meta);
        }
    }
}

}  // namespace
}  // namespace mt::nn
