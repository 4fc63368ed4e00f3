// Muon's Newton-Schulz and step (ops/muon.h; muon.md §9 test 1): f64 against a direct evaluation of the iteration
// (plain loops, rho <= 1e-12); the tall path equals the transpose of the wide one (rho <= 1e-14); the output's largest
// singular value stays at or below the quintic's maximum 1.2025 for any input; a 128 x 512 Gaussian matrix ends with
// every singular value in [0.6, 1.21]; the step's momentum, Nesterov, decay and scale as muon.md §1 writes them.
#include "ops/muon.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "op_harness.h"
#include "support/rho.h"

namespace mt::ops {
namespace {

using core::DType;
using core::Tensor;

using Mat = std::vector<double>;  // row-major

Tensor random(const core::Shape& shape, uint64_t seed, double scale = 1.0) {
    const Tensor t = Tensor::zeros(shape, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i)
        core::tensor_set_flat(t, i, scale * (static_cast<double>(core::rng_u64(seed, 3, i) % 20001) / 10000.0 - 1.0));
    return t;
}

// A standard Gaussian matrix (Box-Muller on the Philox draws).
Tensor gaussian(int64_t rows, int64_t cols, uint64_t seed) {
    const Tensor t = Tensor::zeros({1, rows, cols}, DType::f64);
    for (int64_t i = 0; i < t.numel(); ++i) {
        const double u1 = (static_cast<double>(core::rng_u64(seed, 1, i) % 1000000) + 0.5) / 1e6;
        const double u2 = (static_cast<double>(core::rng_u64(seed, 2, i) % 1000000) + 0.5) / 1e6;
        core::tensor_set_flat(t, i, std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
    return t;
}

Mat matmul(const Mat& a, const Mat& b, int64_t n, int64_t k, int64_t m, bool b_transposed = false) {
    Mat c(static_cast<size_t>(n * m), 0.0);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) {
            double s = 0.0;
            for (int64_t l = 0; l < k; ++l) s += a[i * k + l] * (b_transposed ? b[j * k + l] : b[l * m + j]);
            c[i * m + j] = s;
        }
    return c;
}

// muon.md §1 evaluated directly: X_0 = x / (||x|| + 1e-7) (transposed when tall), the quintic steps, transposed back.
Mat direct_ns(const Mat& x, int64_t a_rows, int64_t b_cols, const MuonHyper& h) {
    const bool tall = a_rows > b_cols;
    const int64_t p = std::min(a_rows, b_cols), q = std::max(a_rows, b_cols);
    double norm = 0.0;
    for (double v : x) norm += v * v;
    norm = std::sqrt(norm) + 1e-7;
    Mat cur(static_cast<size_t>(p * q));
    for (int64_t i = 0; i < a_rows; ++i)
        for (int64_t j = 0; j < b_cols; ++j) cur[tall ? j * q + i : i * q + j] = x[i * b_cols + j] / norm;
    for (int k = 0; k < h.total_steps(); ++k) {
        double a = 0, b = 0, c = 0;
        h.coeffs(k, a, b, c);
        const Mat gram = matmul(cur, cur, p, q, p, true);
        const Mat gram2 = matmul(gram, gram, p, p, p);
        Mat poly(gram.size());
        for (size_t i = 0; i < poly.size(); ++i) poly[i] = b * gram[i] + c * gram2[i];
        const Mat px = matmul(poly, cur, p, p, q);
        for (size_t i = 0; i < cur.size(); ++i) cur[i] = a * cur[i] + px[i];
    }
    Mat out(x.size());
    for (int64_t i = 0; i < a_rows; ++i)
        for (int64_t j = 0; j < b_cols; ++j) out[i * b_cols + j] = cur[tall ? j * q + i : i * q + j];
    return out;
}

Mat values(const Tensor& t) {
    return Mat(t.data<double>(), t.data<double>() + t.numel());
}

// The singular values of o [rows, cols] (rows <= cols): square roots of the eigenvalues of o o^T by cyclic Jacobi.
std::vector<double> singular_values(const Mat& o, int64_t rows, int64_t cols) {
    Mat s = matmul(o, o, rows, cols, rows, true);
    const int64_t n = rows;
    for (int sweep = 0; sweep < 60; ++sweep) {
        double off = 0.0;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = i + 1; j < n; ++j) off += s[i * n + j] * s[i * n + j];
        if (off < 1e-26) break;
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) {
                if (std::abs(s[p * n + q]) < 1e-300) continue;
                const double theta = (s[q * n + q] - s[p * n + p]) / (2.0 * s[p * n + q]);
                const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1.0));
                const double c = 1.0 / std::sqrt(t * t + 1.0), sn = t * c;
                for (int64_t k = 0; k < n; ++k) {  // columns p, q
                    const double kp = s[k * n + p], kq = s[k * n + q];
                    s[k * n + p] = c * kp - sn * kq;
                    s[k * n + q] = sn * kp + c * kq;
                }
                for (int64_t k = 0; k < n; ++k) {  // rows p, q
                    const double pk = s[p * n + k], qk = s[q * n + k];
                    s[p * n + k] = c * pk - sn * qk;
                    s[q * n + k] = sn * pk + c * qk;
                }
            }
    }
    std::vector<double> sv;
    for (int64_t i = 0; i < n; ++i) sv.push_back(std::sqrt(std::max(s[i * n + i], 0.0)));
    return sv;
}

TEST(NewtonSchulz, EqualsTheDirectIterationInF64) {
    for (bool hybrid : {false, true})
        for (auto [e, a, b] : std::vector<std::array<int64_t, 3>>{{1, 24, 40}, {1, 40, 24}, {3, 16, 8}, {2, 12, 12}}) {
            const MuonHyper h{.hybrid = hybrid};
            const Tensor x = random({e, a, b}, 7 + a), out = Tensor::zeros(x.shape(), DType::f64);
            newton_schulz(x, out, h);
            for (int64_t m = 0; m < e; ++m) {
                const Mat want = direct_ns(values(x.select(0, m).clone()), a, b, h);
                const Tensor want_t = Tensor::borrow(const_cast<double*>(want.data()), {a, b}, DType::f64);
                EXPECT_LE(mt::testing::rho(out.select(0, m).clone(), want_t), 1e-12)
                    << e << "x" << a << "x" << b << " matrix " << m << (hybrid ? " hybrid" : "");
            }
        }
}

TEST(NewtonSchulz, TallInputIsTheTransposeOfTheWideOne) {
    const MuonHyper h;
    const Tensor wide = random({1, 12, 30}, 3), tall = Tensor::zeros({1, 30, 12}, DType::f64);
    for (int64_t i = 0; i < 12; ++i)
        for (int64_t j = 0; j < 30; ++j)
            core::tensor_set_flat(tall, j * 12 + i, core::tensor_get_flat(wide, i * 30 + j));
    const Tensor ow = Tensor::zeros(wide.shape(), DType::f64), ot = Tensor::zeros(tall.shape(), DType::f64);
    newton_schulz(wide, ow, h);
    newton_schulz(tall, ot, h);
    // Equal up to the order of the norm's sum (the input's element order differs): rho <= 1e-14.
    const Tensor back = Tensor::zeros(ow.shape(), DType::f64);
    for (int64_t i = 0; i < 12; ++i)
        for (int64_t j = 0; j < 30; ++j) core::tensor_set_flat(back, i * 30 + j, core::tensor_get_flat(ot, j * 12 + i));
    EXPECT_LE(mt::testing::rho(ow, back), 1e-14);
}

// The quintic's maximum on [0, 1] is 1.2024: no input, however conditioned, leaves a larger singular value. Inputs:
// random, rank one (a single large singular value), and a matrix with singular values over six decades.
TEST(NewtonSchulz, LargestSingularValueStaysBelowTheQuinticsMaximum) {
    const int64_t rows = 16, cols = 48;
    std::vector<Tensor> inputs = {random({1, rows, cols}, 11), random({1, rows, cols}, 12, 1e-3)};
    Tensor rank_one = Tensor::zeros({1, rows, cols}, DType::f64), graded = random({1, rows, cols}, 13);
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
            core::tensor_set_flat(
                rank_one, i * cols + j, std::sin(0.3 * static_cast<double>(i + 1)) * std::cos(0.1 * j));
            core::tensor_set_flat(
                graded, i * cols + j, core::tensor_get_flat(graded, i * cols + j) * std::pow(10.0, -0.4 * i));
        }
    inputs.push_back(rank_one);
    inputs.push_back(graded);
    for (size_t k = 0; k < inputs.size(); ++k) {
        const Tensor out = Tensor::zeros(inputs[k].shape(), DType::f64);
        newton_schulz(inputs[k], out, MuonHyper{});
        const std::vector<double> sv = singular_values(values(out), rows, cols);
        EXPECT_LE(*std::max_element(sv.begin(), sv.end()), 1.2025) << "input " << k;
    }
}

TEST(NewtonSchulz, GaussianMatrixEndsWithSingularValuesNearOne) {
    const Tensor x = gaussian(128, 512, 5), out = Tensor::zeros(x.shape(), DType::f64);
    newton_schulz(x, out, MuonHyper{});
    const std::vector<double> sv = singular_values(values(out), 128, 512);
    const auto [lo, hi] = std::minmax_element(sv.begin(), sv.end());
    EXPECT_GE(*lo, 0.6);
    EXPECT_LE(*hi, 1.21);
    std::printf("128 x 512 Gaussian: singular values in [%.3f, %.3f] (reference 0.68-1.13)\n", *lo, *hi);
}

// Two steps of muon_step on a stack of two 6 x 10 matrices against muon.md §1 written out: m = mu m + s g,
// n = s g + mu m, W = (1 - lr wd) W - lr 0.2 sqrt(10) NS(n); with Nesterov and without, f64.
TEST(MuonStep, FollowsTheUpdateRule) {
    for (bool nesterov : {true, false}) {
        const MuonHyper h{.lr = 0.05, .momentum = 0.9, .nesterov = nesterov, .weight_decay = 0.1};
        const Tensor w = random({2, 6, 10}, 21), m = Tensor::zeros(w.shape(), DType::f64);
        Mat want_w = values(w), want_m(want_w.size(), 0.0);
        const Tensor update_sq = Tensor::zeros({1}, DType::f64);
        double want_sq = 0.0;
        for (int step = 0; step < 2; ++step) {
            const Tensor g = random(w.shape(), 30 + step);
            const double s = 0.5;
            muon_step(w, g, m, h, s, update_sq);
            for (int64_t e = 0; e < 2; ++e) {
                Mat n(60);
                for (int64_t i = 0; i < 60; ++i) {
                    const double gi = s * core::tensor_get_flat(g, e * 60 + i);
                    double& mi = want_m[static_cast<size_t>(e * 60 + i)];
                    mi = h.momentum * mi + gi;
                    n[static_cast<size_t>(i)] = nesterov ? gi + h.momentum * mi : mi;
                }
                const Mat o = direct_ns(n, 6, 10, h);
                for (int64_t i = 0; i < 60; ++i) {
                    double& wi = want_w[static_cast<size_t>(e * 60 + i)];
                    const double before = wi;
                    wi = (1.0 - h.lr * h.weight_decay) * wi - h.lr * 0.2 * std::sqrt(10.0) * o[static_cast<size_t>(i)];
                    want_sq += (wi - before) * (wi - before);
                }
            }
        }
        EXPECT_LE(mt::testing::rho(w, Tensor::borrow(want_w.data(), w.shape(), DType::f64)), 1e-12);
        EXPECT_LE(mt::testing::rho(m, Tensor::borrow(want_m.data(), m.shape(), DType::f64)), 1e-12);
        EXPECT_NEAR(core::tensor_get_flat(update_sq, 0), want_sq, 1e-12 * want_sq);
    }
}

// update_sq of length E: each matrix's squared change added to its own element, their sum the [1] form's total.
TEST(MuonStep, UpdateSqPerMatrixSplitsTheTotal) {
    const MuonHyper h{.lr = 0.05, .weight_decay = 0.1};
    const Tensor w0 = random({3, 7, 11}, 61), g = random(w0.shape(), 62);
    const Tensor total = Tensor::zeros({1}, DType::f64), each = Tensor::zeros({3}, DType::f64);
    core::tensor_set_flat(each, 1, 0.5);  // accumulates
    const Tensor w1 = w0.clone(), w2 = w0.clone();
    muon_step(w1, g, Tensor::zeros(w0.shape(), DType::f64), h, 1.0, total);
    muon_step(w2, g, Tensor::zeros(w0.shape(), DType::f64), h, 1.0, each);
    double sum = -0.5;
    for (int64_t e = 0; e < 3; ++e) {
        double want = 0.0;
        for (int64_t i = 0; i < 77; ++i) {
            const double d = core::tensor_get_flat(w2, e * 77 + i) - core::tensor_get_flat(w0, e * 77 + i);
            want += d * d;
        }
        const double got = core::tensor_get_flat(each, e) - (e == 1 ? 0.5 : 0.0);
        EXPECT_NEAR(got, want, 1e-12 * want) << "matrix " << e;
        sum += core::tensor_get_flat(each, e);
    }
    EXPECT_NEAR(sum, core::tensor_get_flat(total, 0), 1e-12 * sum);
}

// The two halves around newton_schulz (the tensor-parallel path of optim::Muon) are muon_step bit for bit, in f64 and
// f32, with and without Nesterov, the per-matrix update_sq included.
TEST(MuonStep, MomentumNewtonSchulzApplyIsTheFusedStep) {
    for (DType dtype : {DType::f64, DType::f32})
        for (bool nesterov : {true, false}) {
            const MuonHyper h{.lr = 0.05, .momentum = 0.9, .nesterov = nesterov, .weight_decay = 0.1};
            const Tensor w0 = random({3, 12, 7}, 71).to(dtype);
            const Tensor fused = w0.clone(), split = w0.clone();
            const Tensor m_fused = Tensor::zeros(w0.shape(), dtype), m_split = Tensor::zeros(w0.shape(), dtype);
            const Tensor sq_fused = Tensor::zeros({3}, DType::f64), sq_split = Tensor::zeros({3}, DType::f64);
            for (int step = 0; step < 2; ++step) {
                const Tensor g = random(w0.shape(), 72 + step).to(dtype);
                muon_step(fused, g, m_fused, h, 0.5, sq_fused);
                const Tensor n = Tensor::zeros(w0.shape(), dtype), o = Tensor::zeros(w0.shape(), dtype);
                muon_momentum(g, m_split, n, h, 0.5);
                newton_schulz(n, o, h);
                muon_apply(split, o, 1.0 - h.lr * h.weight_decay, h.lr * h.scale_factor * std::sqrt(12.0), sq_split);
            }
            for (const auto& [a, b] :
                 {std::pair{fused, split}, std::pair{m_fused, m_split}, std::pair{sq_fused, sq_split}})
                for (int64_t i = 0; i < a.numel(); ++i)
                    ASSERT_EQ(core::tensor_get_flat(a, i), core::tensor_get_flat(b, i))
                        << core::dtype_name(dtype) << " nesterov " << nesterov << " element " << i;
        }
}

// The update's RMS is about scale_factor x lr (an orthogonal A x B matrix has RMS 1 / sqrt(max(A, B))): what lets
// AdamW's learning rate carry over.
TEST(MuonStep, UpdateRmsIsAboutTheScaleFactorTimesTheLearningRate) {
    const MuonHyper h{.lr = 1.0, .nesterov = false, .weight_decay = 0.0};
    const Tensor w = Tensor::zeros({1, 64, 256}, DType::f64), m = Tensor::zeros(w.shape(), DType::f64);
    muon_step(w, gaussian(64, 256, 9), m, h, 1.0);
    double sq = 0.0;
    for (int64_t i = 0; i < w.numel(); ++i) sq += core::tensor_get_flat(w, i) * core::tensor_get_flat(w, i);
    const double rms = std::sqrt(sq / static_cast<double>(w.numel()));
    EXPECT_GT(rms, 0.15);
    EXPECT_LT(rms, 0.25);
}

// The op harness's checks (OpCheck.muon_*): bitwise the same with 1 and 3 OpenMP threads (a stack of 5 matrices),
// and one error naming the argument for each kind of bad input.
void threads_bitwise() {
    const MuonHyper h;
    auto run = [&](int threads) {
        const int before = omp_get_max_threads();
        omp_set_num_threads(threads);
        const Tensor w = random({5, 9, 14}, 41).to(DType::f32), m = Tensor::zeros(w.shape(), DType::f32);
        for (int step = 0; step < 2; ++step) muon_step(w, random(w.shape(), 50 + step).to(DType::f32), m, h, 0.7);
        omp_set_num_threads(before);
        return w;
    };
    const Tensor one = run(1), three = run(3);
    for (int64_t i = 0; i < one.numel(); ++i)
        ASSERT_EQ(core::tensor_get_flat(one, i), core::tensor_get_flat(three, i)) << "element " << i;
}

void argument_errors() {
    const Tensor p = Tensor::zeros({2, 3, 4}, DType::f32), g = test::op_like(p), m = test::op_like(p);
    const MuonHyper h;
    muon_step(p, g, m, h, 1.0);
    test::expect_op_error(
        [&] {
            muon_step(p, Tensor::zeros({2, 3, 5}, DType::f32), m, h, 1.0);
        },
        "muon_step: grad has shape [2, 3, 5], expected [2, 3, 4]");
    test::expect_op_error([&] { muon_step(p, g, m.to(DType::f64), h, 1.0); },
                          "muon_step: m has dtype f64, expected f32 (the dtype of param)");
    test::expect_op_error([&] { muon_step(p.reshape({6, 4}), g, m, h, 1.0); }, "muon_step: param has shape [6, 4]");
    test::expect_op_error([&] { muon_step(p, g, m, MuonHyper{.ns_steps = 0}, 1.0); },
                          "muon_step: 0 Newton-Schulz steps");
    test::expect_op_error(
        [&] {
            newton_schulz(p, Tensor::zeros({2, 4, 3}, DType::f32), h);
        },
        "newton_schulz: out has shape [2, 4, 3], expected [2, 3, 4]");
}

[[maybe_unused]] const bool kRegistered = [] {
    test::op_register_check("muon", "muon_threads_bitwise", threads_bitwise);
    test::op_register_check("muon", "muon_argument_errors", argument_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops
