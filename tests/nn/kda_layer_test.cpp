// The KDA layer (nn/layers/kda_layer.h) in f64: finite-difference checks of every parameter, the input and the initial
// state on the loss sum(out * R1) + sum(S_T * R2), for both gates, GVA and T across a chunk; chunked equals the
// token loop through the whole layer; and the dump the PyTorch parity script reads (KdaLayerParity.Dump, which
// runs only when MT_KDA_PARITY_DIR names a directory; tests/scripts/kda_parity.sh sets it).
#include "nn/layers/kda_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "core/rng.h"
#include "train/safetensors.h"

namespace mt::nn {
namespace {

using core::DType;
using core::Tensor;

ModelConfig small_model() {
    ModelConfig c;
    c.d_model = 12;
    c.n_layers = 2;
    c.n_heads = 2;
    c.init_std = 0.3;  // large enough that every path carries gradient
    return c;
}

KdaConfig small_kda(ops::KdaGateKind gate) {
    KdaConfig k;
    k.num_heads = 2;
    k.num_v_heads = 4;  // GVA: two value heads per q/k head
    k.head_dim = 4;
    k.head_v_dim = 3;
    k.gate = gate;
    k.chunk_size = 32;
    return k;
}

ModelConfig with_kda(ModelConfig cfg, const KdaConfig& kda) {
    cfg.kda = kda;
    return cfg;
}

// A layer with its parameters, inputs and loss weights.
struct Fixture {
    ParamTable table;
    KdaLayer layer;
    Workspace ws;
    int64_t b, t;
    Tensor x, s0, r_out, r_st, out;

    Fixture(const ModelConfig& cfg, const KdaConfig& kda, DType dtype, int64_t b_, int64_t t_, uint64_t seed)
        : layer(table, "layers.0.kda", with_kda(cfg, kda)), b(b_), t(t_) {
        const Precision precision = Precision::cpu(dtype);
        table.finalize(precision);
        table.initialize(seed);  // A_log and dt_bias included (kda.md §3's init)
        // Generic values for the parameters that start constant (norm gain, A_log with the bounded gate), and
        // dt_bias spread so that the gate is neither saturated nor flat.
        for (int i = 0; i < table.size(); ++i) {
            const std::string& name = table.spec(i).name;
            const uint64_t stream = core::hash_name(name.c_str());
            if (name.ends_with("o_norm.weight")) core::rng_fill_uniform(table.master(i), seed, stream, 0.5, 1.5);
            if (name.ends_with("A_log")) core::rng_fill_uniform(table.master(i), seed, stream, -0.5, 0.5);
            if (name.ends_with("dt_bias")) core::rng_fill_uniform(table.master(i), seed, stream, -2.0, 1.0);
        }
        table.refresh_params_from_master();
        layer.resize(b, t, precision);
        const int64_t hv = layer.num_v_heads(), kd = layer.head_dim(), vd = layer.head_v_dim();
        x = Tensor::zeros({b * t, cfg.d_model}, dtype);
        core::rng_fill_normal(x, seed, 1, 0.0, 1.0);
        s0 = Tensor::zeros({b, hv, kd, vd}, dtype);
        core::rng_fill_normal(s0, seed, 2, 0.0, 0.5);
        r_out = Tensor::zeros({b * t, cfg.d_model}, dtype);
        core::rng_fill_normal(r_out, seed, 3, 0.0, 1.0);
        r_st = Tensor::zeros({b, hv, kd, vd}, dtype);
        core::rng_fill_normal(r_st, seed, 4, 0.0, 1.0);
        out = Tensor::zeros({b * t, cfg.d_model}, dtype);
        layer.set_initial_state(s0);
        layer.set_final_state_grad(r_st);
    }

    // L = sum(out * R1) + sum(S_T * R2), and |terms| summed (the rounding scale of L).
    double loss(double* abs_sum = nullptr) {
        layer.forward(x, out);
        long double l = 0, a = 0;
        auto acc = [&](const Tensor& u, const Tensor& r) {
            for (int64_t i = 0; i < u.numel(); ++i) {
                const long double term =
                    static_cast<long double>(core::tensor_get_flat(u, i)) * core::tensor_get_flat(r, i);
                l += term;
                a += std::fabs(term);
            }
        };
        acc(out, r_out);
        acc(layer.final_state(), r_st);
        if (abs_sum) *abs_sum = static_cast<double>(a);
        return static_cast<double>(l);
    }

    // Forward, then backward into fresh grads; returns dx (dS_0 is layer.initial_state_grad()).
    Tensor backward() {
        table.zero_grads();
        loss();
        const Tensor dx = Tensor::zeros(x.shape(), x.dtype());
        layer.backward(x, r_out, dx, ws);
        return dx;
    }
};

// Directional finite differences of L along `dir` for tensor `w` (perturbed in place), against the analytic
// gradient `grad`; returns the relative error as the op harness measures it. The difference is the five-point
// stencil [8 (L(h) - L(-h)) - (L(2h) - L(-2h))] / 6 = 2h L' + O(h^5): with the softplus gate the loss is curved
// enough (through the L2 norms of short k rows) that the plain central difference is off by ~1e-5 at h = 1e-6.
double fd_error(Fixture& f, const Tensor& w, const Tensor& grad, const Tensor& dir, double noise) {
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
        return static_cast<long double>(f.loss());
    };
    const long double d1 = loss_at(1) - loss_at(-1), d2 = loss_at(2) - loss_at(-2);
    w.copy_from(orig);
    const double fd = static_cast<double>((8 * d1 - d2) / 6), an = static_cast<double>(analytic);
    const double denom = std::max({std::fabs(fd), std::fabs(an), 3 * noise / 1e-6, 1e-300});
    return std::fabs(fd - an) / denom;
}

void check_layer_grads(ops::KdaGateKind gate, int64_t t) {
    Fixture f(small_model(), small_kda(gate), DType::f64, 2, t, 17);
    if (gate == ops::KdaGateKind::softplus) {  // a in [1, 16) as at init: decays far past -5
        const int a = f.table.find("layers.0.kda.A_log");
        core::rng_fill_uniform(f.table.master(a), 3, 3, 0.0, std::log(16.0));
        f.table.refresh_params_from_master();
    }
    const Tensor dx = f.backward();
    const Tensor ds0 = f.layer.initial_state_grad().clone();
    double abs_sum = 0;
    f.loss(&abs_sum);
    const double noise = 64 * 2.2e-16 * abs_sum;
    std::vector<std::pair<std::string, std::pair<Tensor, Tensor>>> targets;  // name -> (value, grad)
    for (int i = 0; i < f.table.size(); ++i) {
        targets.push_back({f.table.spec(i).name, {f.table.param(i), f.table.grad(i).clone()}});
    }
    targets.push_back({"x", {f.x, dx}});
    targets.push_back({"s0", {f.s0, ds0}});
    double worst = 0;
    for (size_t n = 0; n < targets.size(); ++n) {
        const auto& [name, vg] = targets[n];
        const Tensor& w = vg.first;
        for (int probe = 0; probe < 5; ++probe) {
            Tensor dir = Tensor::zeros(w.shape(), DType::f64);
            if (probe < 2) {
                core::rng_fill_normal(dir, 91, 16 * n + probe, 0.0, 1.0);
            } else {
                const int64_t i = static_cast<int64_t>(core::rng_u64(92, n, probe) % static_cast<uint64_t>(w.numel()));
                core::tensor_set_flat(dir, i, 1.0);
            }
            const double err = fd_error(f, w, vg.second, dir, noise);
            worst = std::max(worst, err);
            EXPECT_LE(err, 1e-6) << name << " probe " << probe;
        }
    }
    std::printf("[ KDA LAYER ] %s gate, T = %ld: worst finite-difference error %.3e over %zu tensors\n",
                gate == ops::KdaGateKind::softplus ? "softplus" : "bounded",
                static_cast<long>(t),
                worst,
                targets.size());
    testing::Test::RecordProperty("worst_rel_error", fmt::format("{:.3e}", worst));
}

TEST(KdaLayerGrad, BoundedGate) {
    check_layer_grads(ops::KdaGateKind::lower_bound, 37);
}

TEST(KdaLayerGrad, SoftplusGate) {
    check_layer_grads(ops::KdaGateKind::softplus, 37);
}

class KdaLayerAlgorithms : public ::testing::TestWithParam<ops::KdaGateKind> {};

TEST_P(KdaLayerAlgorithms, ChunkedEqualsRecurrent) {
    KdaConfig chunked = small_kda(GetParam()), loop = chunked;
    loop.algorithm = ops::KdaAlgorithm::recurrent;
    Fixture a(small_model(), chunked, DType::f64, 2, 70, 5), b(small_model(), loop, DType::f64, 2, 70, 5);
    const Tensor dxa = a.backward(), dxb = b.backward();
    auto rho = [](const Tensor& x, const Tensor& y) {
        double d = 0, n = 0;
        for (int64_t i = 0; i < x.numel(); ++i) {
            const double u = core::tensor_get_flat(x, i), v = core::tensor_get_flat(y, i);
            d += (u - v) * (u - v);
            n += v * v;
        }
        return std::sqrt(d / n);
    };
    EXPECT_LT(rho(a.out, b.out), 1e-12);
    EXPECT_LT(rho(a.layer.final_state(), b.layer.final_state()), 1e-12);
    EXPECT_LT(rho(dxa, dxb), 1e-12);
    EXPECT_LT(rho(a.layer.initial_state_grad(), b.layer.initial_state_grad()), 1e-12);
    EXPECT_LT(rho(a.table.grad_arena(), b.table.grad_arena()), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(BothGates,
                         KdaLayerAlgorithms,
                         ::testing::Values(ops::KdaGateKind::lower_bound, ops::KdaGateKind::softplus));

// kda.save: the CPU keeps nothing, so their check is a GPU test
// (GpuKdaLayerSaved, kda_layer_gpu_test.cpp).

TEST(KdaLayerShapes, SavedTensorsAndShapes) {
    Fixture f(small_model(), small_kda(ops::KdaGateKind::lower_bound), DType::f32, 1, 5, 3);
    f.loss();
    EXPECT_EQ(f.layer.final_state().shape(), (core::Shape{1, 4, 4, 3}));
    EXPECT_GT(saved_bytes(f.layer.saved_for_backward()), 0u);
    EXPECT_GE(f.table.find("layers.0.kda.q_conv1d.weight"), 0);
    EXPECT_EQ(f.table.spec(f.table.find("layers.0.kda.dt_bias")).shape, (core::Shape{16}));
}

// Writes one layer evaluation (parameters, inputs, outputs, gradients) for tests/scripts/kda_parity.sh, in f64 and
// f32, for both gates.
TEST(KdaLayerParity, Dump) {
    const char* dir = std::getenv("MT_KDA_PARITY_DIR");
    if (!dir) GTEST_SKIP() << "MT_KDA_PARITY_DIR is not set (tests/scripts/kda_parity.sh sets it)";
    for (ops::KdaGateKind gate : {ops::KdaGateKind::lower_bound, ops::KdaGateKind::softplus}) {
        for (DType dtype : {DType::f64, DType::f32}) {
            ModelConfig cfg = small_model();
            cfg.d_model = 16;
            KdaConfig kda = small_kda(gate);
            kda.head_dim = 8;
            kda.head_v_dim = 6;
            kda.chunk_size = 64;
            Fixture f(cfg, kda, dtype, 2, 150, 23);
            const Tensor dx = f.backward();
            std::vector<std::pair<std::string, Tensor>> tensors = {{"x", f.x},
                                                                   {"s0", f.s0},
                                                                   {"r_out", f.r_out},
                                                                   {"r_st", f.r_st},
                                                                   {"out", f.out},
                                                                   {"st", f.layer.final_state()},
                                                                   {"dx", dx},
                                                                   {"ds0", f.layer.initial_state_grad()}};
            for (int i = 0; i < f.table.size(); ++i) {
                tensors.push_back({"param/" + f.table.spec(i).name, f.table.param(i)});
                tensors.push_back({"grad/" + f.table.spec(i).name, f.table.grad(i)});
            }
            const bool softplus = gate == ops::KdaGateKind::softplus;
            const std::map<std::string, std::string> meta = {
                {"format", "moetrain-kda-parity"},
                {"prefix", "layers.0.kda"},
                {"d_model", std::to_string(cfg.d_model)},
                {"num_heads", std::to_string(kda.num_heads)},
                {"num_v_heads", std::to_string(kda.num_v_heads)},
                {"head_dim", std::to_string(kda.head_dim)},
                {"head_v_dim", std::to_string(kda.head_v_dim)},
                {"conv_size", std::to_string(kda.conv_size)},
                {"gate", enum_name(kda.gate)},
                {"gate_lower_bound", fmt::format("{}", kda.gate_lower_bound)},
                {"gate_use_a_log", kda.gate_use_a_log ? "true" : "false"},
                {"norm_eps", fmt::format("{}", cfg.norm_eps)},
            };
            const std::string path = fmt::format(
                "{}/kda_{}_{}.safetensors", dir, softplus ? "softplus" : "bounded", core::dtype_name(dtype));
            train::safetensors_write(path, tensors, meta);
        }
    }
}

}  // namespace
}  // namespace mt::nn
