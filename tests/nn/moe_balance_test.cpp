// Load balancing (nn/layers/moe_balance.h, moe.md §2 and §6 tests 5-8, 11): Quantile Balancing on synthetic, strongly
// skewed scores (exact and histogram estimators), the exact-step and histogram-step properties, Megatron-LM's unit
// vector, the update interval, checkpoint round trips, the sign rule with ties and centring, and the aux loss at
// balance.
#include "nn/layers/moe_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"
#include "nn/layers/moe_metrics.h"
#include "ops/moe_router.h"
#include "train/safetensors.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

// Routing of fixed logits under a bias: scores, indices, cutoff, per-expert loads.
struct Routed {
    Tensor scores, indices, gates, cutoff;
    std::vector<int64_t> load;
};

Routed route(const Tensor& logits, const std::vector<float>& bias, int64_t k) {
    const int64_t t = logits.size(0), n = logits.size(1);
    Routed r{Tensor::zeros({t, n}, logits.dtype()),
             Tensor::zeros({t, k}, DType::i32),
             Tensor::zeros({t, k}, logits.dtype()),
             Tensor::zeros({t}, logits.dtype()),
             std::vector<int64_t>(static_cast<size_t>(n), 0)};
    Tensor b = Tensor::zeros({n}, logits.dtype());
    for (int64_t j = 0; j < n; ++j) core::tensor_set_flat(b, j, bias[static_cast<size_t>(j)]);
    ops::moe_router_fwd(logits, b, r.scores, r.indices, r.gates, r.cutoff, {k, ops::MoeScore::sigmoid, true, 1.0});
    const int32_t* idx = r.indices.data<int32_t>();
    for (int64_t s = 0; s < t * k; ++s) ++r.load[static_cast<size_t>(idx[s])];
    return r;
}

// z_ij = eps_ij + mu_j, eps ~ N(0, 1), mu_j ~ N(0, 1.5^2) (moe.md §6 test 6), f64.
Tensor skewed_logits(int64_t t, int64_t n, uint64_t seed, uint64_t batch) {
    Tensor z = Tensor::zeros({t, n}, DType::f64);
    core::rng_fill_normal(z, seed, 10 + batch, 0.0, 1.0);
    double* p = z.data<double>();
    for (int64_t j = 0; j < n; ++j) {
        const double mu = 1.5 * core::rng_normal(seed, 1, static_cast<uint64_t>(j));
        for (int64_t i = 0; i < t; ++i) p[i * n + j] += mu;
    }
    return z;
}

MoeStepMetrics metrics_of(const Routed& r, int64_t t, int64_t k, const std::vector<float>& bias) {
    return moe_metrics_compute(r.load, t, k, 0, bias, 0.0, 0.0, 0.0);
}

double mean_of(const std::vector<float>& b) {
    return std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(b.size());
}

// #{i : r_ij < b_j} (strict) or #{i : r_ij <= b_j} for every j, r_ij = cutoff_i - s_ij (the counted batch under b).
std::vector<int64_t> counted(const Routed& r, const std::vector<double>& b, bool inclusive = false) {
    const int64_t t = r.scores.size(0), n = r.scores.size(1);
    std::vector<int64_t> c(static_cast<size_t>(n), 0);
    const double *s = r.scores.data<double>(), *cut = r.cutoff.data<double>();
    for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            const double rij = cut[i] - s[i * n + j], bj = b[static_cast<size_t>(j)];
            c[static_cast<size_t>(j)] += inclusive ? rij <= bj : rij < bj;
        }
    }
    return c;
}

TEST(MoeQuantileBalance, SkewedScoresExactAndHistogram) {
    const int64_t t = 65536, n = 64, k = 4, target = t * k / n;
    const Tensor z = skewed_logits(t, n, 7, 0);
    // exact (sort-based) estimator
    std::vector<float> bias(static_cast<size_t>(n), 0.0f);
    Routed r = route(z, bias, k);
    const double vio0 = metrics_of(r, t, k, bias).max_vio;
    std::printf("[ MOE QB ] T = %ld, n = %ld, k = %ld: initial MaxVio %.2f\n",
                static_cast<long>(t),
                static_cast<long>(n),
                static_cast<long>(k),
                vio0);
    EXPECT_GT(vio0, 10.0);
    double exact_vio1 = 0, exact_vio10 = 0;
    int64_t tie_blocks = 0;  // (expert, update) pairs whose target rank fell inside the ties at the old bias
    for (int update = 1; update <= 10; ++update) {
        std::vector<double> b = moe_qb_exact_bias(r.scores, r.cutoff, k);
        // The exact step balances the counted batch exactly: Tk/n tokens per expert under the old cutoffs. The one
        // exception is structural: token i's (k+1)-th expert j has r_ij = b_j (old) exactly, so when rank Tk/n falls
        // inside that block of ties the count can only bracket it.
        const std::vector<int64_t> lo = counted(r, b), hi = counted(r, b, true);
        for (int64_t j = 0; j < n; ++j) {
            const size_t u = static_cast<size_t>(j);
            if (lo[u] != target) ++tie_blocks;
            ASSERT_TRUE(lo[u] == target || (lo[u] < target && hi[u] >= target)) << "expert " << j << ": " << lo[u];
        }
        const double m = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(n);
        for (int64_t j = 0; j < n; ++j)
            bias[static_cast<size_t>(j)] = static_cast<float>(b[static_cast<size_t>(j)] - m);
        EXPECT_LE(std::fabs(mean_of(bias)), 1e-7);
        r = route(z, bias, k);
        (update == 1 ? exact_vio1 : exact_vio10) = metrics_of(r, t, k, bias).max_vio;
    }
    // histogram estimator (B = 1000), the balancer itself
    MoeBalanceConfig cfg;
    cfg.bins = 1000;
    MoeBalancer qb(n, k, cfg);
    r = route(z, qb.bias(), k);
    MoeStepMetrics hist1, hist10;
    int64_t worst_count_error = 0;
    for (int update = 1; update <= 10; ++update) {
        qb.observe(r.scores, r.cutoff, r.indices);
        ASSERT_TRUE(qb.step());
        // the histogram step is off the exact count by at most the content of the quantile's bin
        const std::vector<int64_t> c = counted(r, qb.last_quantile_target());
        for (int64_t j = 0; j < n; ++j) {
            const int64_t err = std::llabs(c[static_cast<size_t>(j)] - target);
            worst_count_error = std::max(worst_count_error, err);
            ASSERT_LE(err, static_cast<int64_t>(qb.last_quantile_bin_count()[static_cast<size_t>(j)]))
                << "expert " << j;
        }
        EXPECT_LE(std::fabs(mean_of(qb.bias())), 1e-7);
        r = route(z, qb.bias(), k);
        (update == 1 ? hist1 : hist10) = metrics_of(r, t, k, qb.bias());
    }
    std::printf(
        "[ MOE QB ] exact step: re-routed MaxVio %.4f after 1 update, %.4f after 10; counted batch exactly %ld per "
        "expert at every update, except %ld of %ld (expert, update) pairs whose rank fell inside the ties at the old "
        "bias\n",
        exact_vio1,
        exact_vio10,
        static_cast<long>(target),
        static_cast<long>(tie_blocks),
        static_cast<long>(10 * n));
    std::printf(
        "[ MOE QB ] histogram B = 1000: after 1 update MaxVio %.4f, load_var %.2e, max |load - Tk/n| %.0f; "
        "after 10 MaxVio %.4f, load_var %.2e; worst counted error %ld rows; bias range %.3f, |mean| %.1e\n",
        hist1.max_vio,
        hist1.load_var,
        std::max(hist1.max_vio, -hist1.min_vio) * static_cast<double>(target),
        hist10.max_vio,
        hist10.load_var,
        static_cast<long>(worst_count_error),
        hist10.bias_range,
        std::fabs(mean_of(qb.bias())));
    // Re-routed with the new bias, the loads after one update are not yet within tolerance (the cutoffs move with the
    // bias: MaxVio ~0.3 from ~10); the bars of moe.md §6 test 6 apply after 10 updates.
    EXPECT_LE(exact_vio1, 0.5);
    EXPECT_LE(hist1.max_vio, 0.5);
    EXPECT_LE(exact_vio10, 0.05);
    EXPECT_LE(hist10.max_vio, 0.2);
    EXPECT_LE(hist10.load_var, 2e-3);
}

// A fresh batch from the same distribution at every step, routed with the bias of the previous steps.
TEST(MoeQuantileBalance, FreshBatchesHistogram) {
    const int64_t t = 16384, n = 64, k = 4;
    MoeBalanceConfig cfg;
    MoeBalancer qb(n, k, cfg);
    MoeStepMetrics last;
    for (uint64_t step = 0; step < 8; ++step) {
        const Routed r = route(skewed_logits(t, n, 7, 1 + step), qb.bias(), k);
        last = metrics_of(r, t, k, qb.bias());
        qb.observe(r.scores, r.cutoff, r.indices);
        qb.step();
    }
    std::printf("[ MOE QB ] fresh batches (T = %ld): step 8 MaxVio %.4f, load_var %.2e\n",
                static_cast<long>(t),
                last.max_vio,
                last.load_var);
    EXPECT_LE(last.max_vio, 0.2);
    EXPECT_LE(last.load_var, 2e-3);
}

// Megatron-LM's QB unit vector: H = [[0,2,2,0],[2,2,0,0]], bounds (-1, 1), k = 1, b = 0 -> b = (0.25, -0.25), bounds
// (-1.25, 1.25).
TEST(MoeQuantileBalance, MegatronUnitVector) {
    MoeBalanceConfig cfg;
    cfg.bins = 4;
    MoeBalancer qb(2, 1, cfg);
    nlohmann::json state = qb.state_json();
    state["hist"] = std::vector<uint64_t>{0, 2, 2, 0, 2, 2, 0, 0};
    qb.load_state_json(state);
    ASSERT_TRUE(qb.step());
    EXPECT_FLOAT_EQ(qb.bias()[0], 0.25f);
    EXPECT_FLOAT_EQ(qb.bias()[1], -0.25f);
    EXPECT_DOUBLE_EQ(qb.lower(), -1.25);
    EXPECT_DOUBLE_EQ(qb.upper(), 1.25);
}

// update_interval = 3: the bias is constant between updates, and the update uses the sum of the three steps'
// histograms; a save and restore mid-interval continues bitwise (tensors and JSON).
TEST(MoeQuantileBalance, IntervalAndCheckpoint) {
    const int64_t t = 512, n = 16, k = 2;
    MoeBalanceConfig cfg;
    cfg.bins = 200;
    cfg.update_interval = 3;
    cfg.ema = 0.5;
    MoeBalancer a(n, k, cfg);
    MoeBalanceConfig single = cfg;
    single.update_interval = 1000;
    std::vector<uint64_t> summed(static_cast<size_t>(n * cfg.bins), 0);
    for (uint64_t step = 0; step < 3; ++step) {
        const Routed r = route(skewed_logits(t, n, 3, step), a.bias(), k);
        MoeBalancer one(n, k, single);  // the per-step histogram with the same (initial) bounds
        one.observe(r.scores, r.cutoff, r.indices);
        for (size_t i = 0; i < summed.size(); ++i) summed[i] += one.histogram()[i];
        a.observe(r.scores, r.cutoff, r.indices);
        if (step < 2) {
            EXPECT_FALSE(a.step());
            EXPECT_EQ(a.bias(), std::vector<float>(static_cast<size_t>(n), 0.0f));
        } else {
            EXPECT_EQ(a.histogram(), summed);
            MoeBalancer oracle(n, k, cfg);  // the update from the summed histogram alone
            nlohmann::json s = oracle.state_json();
            s["hist"] = summed;
            s["steps_in_interval"] = 2;
            oracle.load_state_json(s);
            EXPECT_TRUE(a.step());
            EXPECT_TRUE(oracle.step());
            EXPECT_EQ(a.bias(), oracle.bias());
        }
    }
    // two more steps (mid-interval), then save; a restored copy continues bitwise
    for (uint64_t step = 3; step < 5; ++step) {
        const Routed r = route(skewed_logits(t, n, 3, step), a.bias(), k);
        a.observe(r.scores, r.cutoff, r.indices);
        a.step();
    }
    MoeBalancer b(n, k, cfg), c(n, k, cfg);
    const std::string prefix = "layers.1.moe.router", path = testing::TempDir() + "moe_balancer_state.safetensors";
    train::safetensors_write(path, a.state_tensors(prefix));  // through a checkpoint file
    const train::SafetensorsFile file(path);
    std::vector<std::pair<std::string, Tensor>> loaded;
    for (const std::string& name : file.keys()) loaded.push_back({name, file.read(name)});
    b.load_state(loaded, prefix);
    c.load_state_json(nlohmann::json::parse(a.state_json().dump()));
    for (uint64_t step = 5; step < 12; ++step) {
        for (MoeBalancer* q : {&a, &b, &c}) {
            const Routed r = route(skewed_logits(t, n, 3, step), q->bias(), k);
            q->observe(r.scores, r.cutoff, r.indices);
            q->step();
        }
        EXPECT_EQ(a.bias(), b.bias());
        EXPECT_EQ(a.bias(), c.bias());
        EXPECT_EQ(a.histogram(), b.histogram());
    }
    EXPECT_EQ(a.updates(), 4);
    EXPECT_LE(std::fabs(mean_of(a.bias())), 1e-7);
    // a checkpoint without the histogram fails naming the tensor
    auto tensors = a.state_tensors("p");
    tensors.pop_back();
    try {
        b.load_state(tensors, "p");
        ADD_FAILURE() << "expected an error";
    } catch (const core::Error& e) {
        EXPECT_NE(std::string(e.what()).find("p.qb_hist"), std::string::npos) << e.what();
        EXPECT_EQ(e.code(), core::ExitCode::checkpoint);
    }
}

// DeepSeek-V3's sign rule: sign(0) = 0 for an expert exactly at the mean; centring subtracts the mean sign.
TEST(MoeSignBias, TiesCentringAndFreeze) {
    auto observe_loads = [](MoeBalancer& b, const std::vector<int32_t>& experts) {
        const int64_t t = static_cast<int64_t>(experts.size());
        Tensor idx = Tensor::zeros({t, 1}, DType::i32), s = Tensor::zeros({t, 4}, DType::f32);
        std::copy(experts.begin(), experts.end(), idx.data<int32_t>());
        b.observe(s, Tensor(), idx);
        b.step();
    };
    MoeBalanceConfig cfg;
    cfg.mode = MoeBalanceMode::sign_bias;
    cfg.sign_rate = 0.125;
    MoeBalancer a(4, 1, cfg);
    observe_loads(a, {0, 0, 0, 1, 2, 2, 3, 3});  // loads 3, 1, 2, 2; mean 2: signs -1, +1, 0, 0
    EXPECT_EQ(a.bias(), (std::vector<float>{-0.125f, 0.125f, 0.0f, 0.0f}));
    observe_loads(a, {0, 0, 0, 0});  // loads 4, 0, 0, 0; mean 1: signs -1, 1, 1, 1, mean 0.5
    EXPECT_EQ(a.bias(), (std::vector<float>{-0.3125f, 0.1875f, 0.0625f, 0.0625f}));
    cfg.sign_centered = false;
    MoeBalancer u(4, 1, cfg);
    observe_loads(u, {0, 0, 0, 0});
    EXPECT_EQ(u.bias(), (std::vector<float>{-0.125f, 0.125f, 0.125f, 0.125f}));
    cfg.sign_freeze_after_tokens = 4;
    MoeBalancer f(4, 1, cfg);
    observe_loads(f, {0, 0, 0, 0});  // 4 tokens seen: frozen
    EXPECT_EQ(f.bias(), std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace mt::nn
