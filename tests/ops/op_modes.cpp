// The harness modes (see op_harness.h): fp64 finite differences, f32 against f64, 1 against 3 OpenMP threads, and
// parity (CPU against CUDA).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/rng.h"
#include "op_harness.h"

namespace mt::ops::test {

namespace {

constexpr double kGradTolerance = 1e-6;
constexpr int kDirections = 3;
constexpr int kCoordinates = 8;
// Rounding noise of one fp64 evaluation of L, in units of eps * sum |out * R| (the ops' own rounding is a few ulps of
// each output; outputs the perturbation does not touch are bitwise equal in both evaluations and cancel).
constexpr double kLossNoiseUlps = 64.0;

// The problem's inputs in `dtype` (float inputs converted, index inputs as they are). Always fresh tensors.
std::vector<Tensor> inputs_as(const OpProblem& p, DType dtype) {
    std::vector<Tensor> in;
    for (const OpInput& x : p.inputs)
        in.push_back(x.value.to(core::dtype_is_float(x.value.dtype()) ? dtype : x.value.dtype()));
    return in;
}

// The loss weights R: one seeded normal tensor per output.
std::vector<Tensor> make_dout(const std::vector<Tensor>& outs, uint64_t seed, DType dtype) {
    std::vector<Tensor> r;
    for (size_t k = 0; k < outs.size(); ++k) r.push_back(op_randn(outs[k].shape(), seed, 100 + k).to(dtype));
    return r;
}

// L = sum_k sum_i out_k[i] * R_k[i], in long double; *abs_sum (if given) gets sum |out_k[i] * R_k[i]|.
long double loss(const std::vector<Tensor>& outs, const std::vector<Tensor>& r, long double* abs_sum = nullptr) {
    long double sum = 0, abs = 0;
    for (size_t k = 0; k < outs.size(); ++k) {
        for (int64_t i = 0; i < outs[k].numel(); ++i) {
            const long double term =
                static_cast<long double>(core::tensor_get_flat(outs[k], i)) * core::tensor_get_flat(r[k], i);
            sum += term;
            abs += std::fabs(term);
        }
    }
    if (abs_sum) *abs_sum = abs;
    return sum;
}

// Runs the backward into pre-filled buffers and returns the gradients in f64 on the host (undefined for
// GradKind::none). Each buffer is on its input's device, with the input's dtype unless grad_dtypes gives one.
std::vector<Tensor> run_backward(const OpProblem& p,
                                 const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 uint64_t seed,
                                 const std::vector<DType>* grad_dtypes = nullptr) {
    std::vector<Tensor> grads(in.size()), prefill(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        if (p.inputs[i].grad == GradKind::none) continue;
        const DType dtype = grad_dtypes ? (*grad_dtypes)[i] : in[i].dtype();
        grads[i] = Tensor::zeros(in[i].shape(), dtype, in[i].device());
        if (p.inputs[i].grad == GradKind::written) {
            grads[i].fill(std::numeric_limits<double>::quiet_NaN());
        } else {
            prefill[i] = op_randn(in[i].shape(), seed, 200 + i, 0.0, 0.5).to(dtype);
            grads[i].copy_from(prefill[i]);
        }
    }
    p.backward(in, dout, grads);
    std::vector<Tensor> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        if (!grads[i].defined()) continue;
        out[i] =
            (grads[i].device() == core::Device::cpu ? grads[i] : grads[i].to_device(core::Device::cpu)).to(DType::f64);
        if (prefill[i].defined())
            for (int64_t j = 0; j < out[i].numel(); ++j)
                core::tensor_set_flat(
                    out[i], j, core::tensor_get_flat(out[i], j) - core::tensor_get_flat(prefill[i], j));
    }
    return out;
}

void expect_finite(const Tensor& t, const std::string& what) {
    for (int64_t i = 0; i < t.numel(); ++i) {
        if (!std::isfinite(core::tensor_get_flat(t, i))) {
            ADD_FAILURE() << what << "[" << i << "] = " << core::tensor_get_flat(t, i) << " is not finite";
            return;
        }
    }
}

// fp64 central differences along random directions and coordinates of every differentiable input. The analytic
// side is g . (x+ - x-) with the perturbed inputs as actually rounded, so the comparison is of two changes of L:
// err = |dL_fd - dL_an| / max(|dL_fd|, |dL_an|, noise / tolerance), where noise bounds the rounding error of
// evaluating L. A coordinate whose gradient is so small that dL drowns in that noise is thus held to the noise
// (an absolute bound) rather than to a relative error that finite differences cannot resolve.
}  // namespace

void op_check_grad(const OpCase& c) {
    const OpProblem p = c.build();
    const uint64_t seed = op_seed(c.name);
    const std::vector<Tensor> in = inputs_as(p, DType::f64);
    const std::vector<Tensor> outs = p.forward(in);
    ASSERT_FALSE(outs.empty());
    for (size_t k = 0; k < outs.size(); ++k) expect_finite(outs[k], "output " + std::to_string(k));
    const std::vector<Tensor> r = make_dout(outs, seed, DType::f64);
    long double abs_sum = 0;
    loss(outs, r, &abs_sum);
    const double noise = kLossNoiseUlps * std::numeric_limits<double>::epsilon() * static_cast<double>(abs_sum);
    const std::vector<Tensor> g = run_backward(p, in, r, seed);
    double worst = 0.0;
    for (size_t a = 0; a < in.size(); ++a) {
        if (p.inputs[a].grad == GradKind::none) continue;
        const std::string& name = p.inputs[a].name;
        expect_finite(g[a], "d" + name);
        const int64_t n = in[a].numel();
        if (n == 0) continue;
        double max_abs = 0.0;
        for (int64_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(core::tensor_get_flat(in[a], i)));
        for (int probe = 0; probe < kDirections + kCoordinates; ++probe) {
            Tensor xp = in[a].clone(), xm = in[a].clone();
            double h;
            if (probe < kDirections) {
                h = 1e-6 * std::max(1.0, max_abs);
                const Tensor u = op_randn(in[a].shape(), seed, 300 + 16 * a + probe);
                for (int64_t i = 0; i < n; ++i) {
                    const double x = core::tensor_get_flat(in[a], i), du = h * core::tensor_get_flat(u, i);
                    core::tensor_set_flat(xp, i, x + du);
                    core::tensor_set_flat(xm, i, x - du);
                }
            } else {
                const int64_t i = static_cast<int64_t>(core::rng_u64(seed, 400 + a, probe) % static_cast<uint64_t>(n));
                const double x = core::tensor_get_flat(in[a], i);
                h = 1e-6 * std::max(1.0, std::fabs(x));
                core::tensor_set_flat(xp, i, x + h);
                core::tensor_set_flat(xm, i, x - h);
            }
            long double analytic = 0;
            for (int64_t i = 0; i < n; ++i)
                analytic += static_cast<long double>(core::tensor_get_flat(g[a], i)) *
                            (core::tensor_get_flat(xp, i) - core::tensor_get_flat(xm, i));
            std::vector<Tensor> in_p = in, in_m = in;
            in_p[a] = xp;
            in_m[a] = xm;
            const long double fd = loss(p.forward(in_p), r) - loss(p.forward(in_m), r);
            const double denom = std::max({std::fabs(static_cast<double>(fd)),
                                           std::fabs(static_cast<double>(analytic)),
                                           noise / kGradTolerance,
                                           std::numeric_limits<double>::min()});
            const double err = std::fabs(static_cast<double>(fd - analytic)) / denom;
            worst = std::max(worst, err);
            EXPECT_LE(err, kGradTolerance)
                << c.name << ": d" << name << " probe " << probe
                << (probe < kDirections ? " (direction)" : " (coordinate)") << ": finite difference "
                << static_cast<double>(fd) << ", analytic " << static_cast<double>(analytic);
        }
    }
    testing::Test::RecordProperty("worst_rel_error", fmt::format("{:.3e}", worst));
}

namespace {

// The f32 result against the f64 one by the parity metric (rho and max-abs), with the case's rms floor: 1e-6 unless
// the case opts in to more (a tensor that is exactly zero in f64, such as dq at T = 1, is rounding noise in f32).
void expect_f32_close(const OpCase& c, const Tensor& got, const Tensor& ref, const std::string& what) {
    const ParityError e = op_parity_error(got, ref, c.f32_rms_floor);
    EXPECT_TRUE(e.within(c.f32_budget)) << c.name << ": " << what << ": rho " << e.rho << ", max-abs " << e.max_abs
                                        << " against f64 (budget " << c.f32_budget << ", max-abs "
                                        << kMaxAbsFactor * c.f32_budget << ", rms floor " << c.f32_rms_floor << ")";
}

// Forward outputs and gradients in f32 and f64, compared by rho.
}  // namespace

void op_check_f32(const OpCase& c) {
    if (c.f32_rms_floor > 1e-6) {
        EXPECT_FALSE(c.f32_floor_reason.empty()) << c.name << ": an f32 rms floor above the default needs a reason";
    }
    if (!c.f32_floor_reason.empty()) testing::Test::RecordProperty("f32_floor_reason", c.f32_floor_reason);
    const OpProblem p = c.build();
    const uint64_t seed = op_seed(c.name);
    const std::vector<Tensor> in64 = inputs_as(p, DType::f64), in32 = inputs_as(p, DType::f32);
    const std::vector<Tensor> o64 = p.forward(in64), o32 = p.forward(in32);
    ASSERT_EQ(o64.size(), o32.size());
    for (size_t k = 0; k < o64.size(); ++k) {
        ASSERT_EQ(o32[k].dtype(), DType::f32) << "output " << k;
        expect_f32_close(c, o32[k], o64[k], "output " + std::to_string(k));
    }
    const std::vector<Tensor> r64 = make_dout(o64, seed, DType::f64);
    std::vector<Tensor> r32;
    for (const Tensor& t : r64) r32.push_back(t.to(DType::f32));
    const std::vector<Tensor> g64 = run_backward(p, in64, r64, seed), g32 = run_backward(p, in32, r32, seed);
    for (size_t a = 0; a < g64.size(); ++a) {
        if (!g64[a].defined()) continue;
        expect_f32_close(c, g32[a], g64[a], "d" + p.inputs[a].name);
    }
}

namespace {

// Raw bytes of the f32 outputs and gradients with `threads` OpenMP threads.
std::vector<std::vector<char>> run_f32_bytes(const OpCase& c, int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const OpProblem p = c.build();
    const std::vector<Tensor> in = inputs_as(p, DType::f32);
    std::vector<Tensor> all = p.forward(in);
    const std::vector<Tensor> dout = make_dout(all, op_seed(c.name), DType::f32);
    for (const Tensor& g : run_backward(p, in, dout, op_seed(c.name)))
        if (g.defined()) all.push_back(g);
    omp_set_num_threads(saved);
    std::vector<std::vector<char>> bytes;
    for (const Tensor& t : all) {
        const char* b = static_cast<const char*>(t.raw());
        bytes.emplace_back(b, b + t.nbytes());
    }
    return bytes;
}

}  // namespace

void op_check_threads(const OpCase& c) {
    const auto one = run_f32_bytes(c, 1), three = run_f32_bytes(c, 3);
    ASSERT_EQ(one.size(), three.size());
    for (size_t i = 0; i < one.size(); ++i)
        EXPECT_TRUE(one[i] == three[i]) << c.name << ": tensor " << i << " differs between 1 and 3 threads";
}

namespace {

// One device run of a case: inputs (float ones rounded to `dtype`) on the GPU, forward outputs and gradients copied
// back to the host. The CPU reference of the same run is `ref`: f32 on the same rounded values.
struct ParityRun {
    std::vector<Tensor> outs;   // forward outputs, host, as the op wrote them
    std::vector<Tensor> grads;  // gradients, host f64 (undefined for GradKind::none)
};

ParityRun run_on(const OpCase& c, DType dtype, core::Device device, std::string* error) {
    const OpProblem p = c.build();
    const uint64_t seed = op_seed(c.name);
    const bool cpu = device == core::Device::cpu;
    std::vector<Tensor> in;
    for (const OpInput& x : p.inputs) {
        if (!core::dtype_is_float(x.value.dtype())) {
            in.push_back(x.value.to_device(device));
            continue;
        }
        const Tensor rounded = x.value.to(dtype);
        in.push_back(cpu ? rounded.to(DType::f32) : rounded.to_device(device));
    }
    ParityRun run;
    try {
        const std::vector<Tensor> outs = p.forward(in);
        // The loss weights R, rounded to `dtype` on both sides (exact in the output's dtype, bf16, f16 or f32).
        std::vector<Tensor> dout;
        for (size_t k = 0; k < outs.size(); ++k) {
            const Tensor r = op_randn(outs[k].shape(), seed, 100 + k).to(dtype);
            dout.push_back(cpu ? r.to(DType::f32) : r.to(outs[k].dtype()).to_device(device));
            run.outs.push_back(cpu ? outs[k] : outs[k].to_device(core::Device::cpu));
        }
        std::vector<DType> grad_dtypes(in.size(), DType::f32);
        for (size_t i = 0; i < in.size(); ++i) {
            if (cpu) break;
            const bool own_dtype =
                p.inputs[i].grad != GradKind::accumulated || c.parity.accumulated_grad_in_input_dtype;
            grad_dtypes[i] =
                own_dtype ? in[i].dtype() : (dtype != DType::f32 ? c.parity.bf16_accumulated_grad : DType::f32);
        }
        run.grads = run_backward(p, in, dout, seed, &grad_dtypes);
    } catch (const core::Error& e) {
        *error = e.what();
    }
    return run;
}

bool names(const std::vector<std::string>& list, const std::string& tensor) {
    return list.empty() || std::find(list.begin(), list.end(), tensor) != list.end();
}

// The rms floor of one compared tensor ("output 0", "dq"): the case's, where floor_tensors is empty or names it.
double floor_of(const OpParityOptions& o, const std::string& tensor) {
    return names(o.floor_tensors, tensor) ? o.rms_floor : 1e-6;
}

// Its max-abs factor, likewise.
double max_abs_factor_of(const OpParityOptions& o, const std::string& tensor) {
    return names(o.max_abs_tensors, tensor) ? o.max_abs_factor : kMaxAbsFactor;
}

}  // namespace

void op_check_parity(const OpCase& c) {
    const OpProblem p = c.build();
    const int64_t compared_before = op_parity_comparisons();
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
        if ((dtype == DType::bf16 && !c.parity.bf16) || (dtype == DType::f16 && !(c.parity.bf16 && c.parity.f16)) ||
            (dtype == DType::f32 && !c.parity.f32))
            continue;
        const double budget = dtype == DType::f32 ? c.parity.f32_budget : c.parity.bf16_budget;
        const std::string tag(core::dtype_name(dtype));
        std::string error;
        const ParityRun ref = run_on(c, dtype, core::Device::cpu, &error);
        ASSERT_TRUE(error.empty()) << c.name << ": the CPU reference failed: " << error;
        const ParityRun got = run_on(c, dtype, core::Device::cuda, &error);
        if (!error.empty()) {
            ADD_FAILURE() << c.name << " " << tag << ": the CUDA side failed: " << error;
            continue;
        }
        ASSERT_EQ(got.outs.size(), ref.outs.size());
        for (size_t k = 0; k < ref.outs.size(); ++k)
            op_expect_parity(c.name,
                             fmt::format("{} output {}", tag, k),
                             got.outs[k],
                             ref.outs[k],
                             budget,
                             floor_of(c.parity, fmt::format("output {}", k)),
                             max_abs_factor_of(c.parity, fmt::format("output {}", k)));
        for (size_t i = 0; i < ref.grads.size(); ++i) {
            if (!ref.grads[i].defined()) continue;
            op_expect_parity(c.name,
                             fmt::format("{} d{}", tag, p.inputs[i].name),
                             got.grads[i],
                             ref.grads[i],
                             budget,
                             floor_of(c.parity, "d" + p.inputs[i].name),
                             max_abs_factor_of(c.parity, "d" + p.inputs[i].name));
        }
        // Deterministic kernels (conventions §1.11): a second device run gives the same bytes.
        const ParityRun again = run_on(c, dtype, core::Device::cuda, &error);
        ASSERT_TRUE(error.empty()) << c.name << " " << tag << ": the second CUDA run failed: " << error;
        for (size_t k = 0; k < got.outs.size(); ++k)
            EXPECT_TRUE(op_same_bytes(got.outs[k], again.outs[k]))
                << c.name << " " << tag << ": output " << k << " differs between two CUDA runs";
        for (size_t i = 0; i < got.grads.size(); ++i) {
            if (!got.grads[i].defined()) continue;
            EXPECT_TRUE(op_same_bytes(got.grads[i], again.grads[i]))
                << c.name << " " << tag << ": d" << p.inputs[i].name << " differs between two CUDA runs";
        }
        if (!c.parity.budget_reason.empty()) testing::Test::RecordProperty("budget_reason", c.parity.budget_reason);
    }
    EXPECT_GT(op_parity_comparisons(), compared_before) << c.name << ": the parity test compared no tensor";
}

}  // namespace mt::ops::test
