// Cases and argument checks of the linear op (ops/linear.h), and direct GPU parity checks of the CUDA path
// (cuBLASLt): bf16 against the CPU f32 reference on the same bf16-rounded inputs (rho <= 1e-2), f32 against f32
// (rho <= 1e-5), and bitwise run-to-run determinism. The GPU tests skip where no GPU is present.
#include "ops/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/backend.h"
#include "op_harness.h"

namespace mt::ops::test {
namespace {

OpCase linear_case(int64_t n, int64_t k, int64_t m, bool bias) {
    const std::string name = fmt::format("linear_n{}_k{}_m{}{}", n, k, m, bias ? "_bias" : "");
    return {"linear", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, k}, s, 0), GradKind::written},
                            {"w", op_randn({m, k}, s, 1, 0.0, 1.0 / std::sqrt(k)), GradKind::accumulated}};
                if (bias) p.inputs.push_back({"bias", op_randn({m}, s, 2), GradKind::accumulated});
                p.forward = [bias](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0], {in[0].size(0), in[1].size(0)});
                    linear_fwd(in[0], in[1], bias ? in[2] : Tensor(), y);
                    return std::vector<Tensor>{y};
                };
                p.backward = [bias](const std::vector<Tensor>& in,
                                    const std::vector<Tensor>& dout,
                                    const std::vector<Tensor>& grads) {
                    linear_bwd(in[0], in[1], dout[0], grads[0], grads[1], bias ? grads[2] : Tensor());
                };
                return p;
            }};
}

// dx accumulated (+=, accumulate_dx): the problem returns x itself as a second output, whose gradient dout[1] is
// the buffer's content before the call, so the checks see dx = dout[1] + dy w.
OpCase linear_accumulate_case(int64_t n, int64_t k, int64_t m) {
    const std::string name = fmt::format("linear_accumulate_dx_n{}_k{}_m{}", n, k, m);
    return {"linear", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, k}, s, 0), GradKind::written},
                            {"w", op_randn({m, k}, s, 1, 0.0, 1.0 / std::sqrt(k)), GradKind::accumulated}};
                p.forward = [](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0], {in[0].size(0), in[1].size(0)}), x = op_like(in[0]);
                    linear_fwd(in[0], in[1], Tensor(), y);
                    x.copy_from(in[0]);
                    return std::vector<Tensor>{y, x};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) {
                    grads[0].copy_from(dout[1]);
                    linear_bwd(in[0], in[1], dout[0], grads[0], grads[1], Tensor(), /*accumulate_dx=*/true);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(linear_accumulate_case(7, 5, 3));
    op_register(linear_accumulate_case(131, 33, 37));
    op_register(op_parity_only(linear_accumulate_case(300, 256, 512)));  // cuBLASLt with beta = 1
    op_register(linear_case(1, 1, 1, false));
    op_register(linear_case(1, 1, 1, true));
    op_register(linear_case(7, 5, 3, true));
    op_register(linear_case(13, 17, 11, false));
    op_register(linear_case(131, 33, 37, true));  // crosses the 128-row chunk of the forward and of dx
    op_register(linear_case(5, 263, 259, true));  // crosses the 256 x 256 tiles of dw
    return true;
}();

TEST(OpArgs, LinearShapesAndDtypes) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({5, 4}, DType::f32);
    const Tensor y = Tensor::zeros({3, 5}, DType::f32), b = Tensor::zeros({5}, DType::f32);
    linear_fwd(x, w, b, y);  // the valid call
    expect_op_error(
        [&] {
            linear_fwd(x, Tensor::zeros({5, 3}, DType::f32), b, y);
        },
        "linear_fwd: w has shape [5, 3], expected [5, 4]");
    expect_op_error(
        [&] {
            linear_fwd(x, w, b, Tensor::zeros({3, 4}, DType::f32));
        },
        "linear_fwd: y has shape [3, 4], expected [3, 5]");
    expect_op_error([&] { linear_fwd(x, w, Tensor::zeros({4}, DType::f32), y); }, "linear_fwd: bias has shape [4]");
    expect_op_error(
        [&] {
            linear_fwd(Tensor::zeros({3, 4, 1}, DType::f32), w, b, y);
        },
        "linear_fwd: x has shape [3, 4, 1] (rank 3), expected rank 2");
    expect_op_error([&] { linear_fwd(x.to(DType::bf16), w, b, y); }, "linear_fwd: x has dtype bf16, expected f32");
    expect_op_error([&] { linear_fwd(x, w.to(DType::f64), b, y); },
                    "linear_fwd: w has dtype f64, expected f32 (the dtype of x)");
    expect_op_error([&] { linear_fwd(x, w, b.to(DType::f64), y); }, "linear_fwd: bias has dtype f64");
    expect_op_error(
        [&] {
            linear_fwd(op_noncontiguous({3, 4}, DType::f32), w, b, y);
        },
        "linear_fwd: x must be contiguous");
    expect_op_error([&] { linear_fwd(x, Tensor(), b, y); }, "linear_fwd: w is undefined");
    expect_op_error(
        [&] {
            linear_fwd(op_cuda_view({3, 4}, DType::f32), w, b, y);
        },
        "linear_fwd: w is on cpu but x is on cuda; all tensors of one call must be on the same device");

    const Tensor dw = Tensor::zeros({5, 4}, DType::f32);
    linear_bwd(x, w, y, x.clone(), dw, b.clone());
    expect_op_error(
        [&] {
            linear_bwd(x, w, Tensor::zeros({3, 4}, DType::f32), x, dw, b);
        },
        "linear_bwd: dy has shape [3, 4], expected [3, 5]");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, Tensor::zeros({4, 4}, DType::f32), dw, b);
        },
        "linear_bwd: dx has shape [4, 4], expected [3, 4]");
    expect_op_error([&] { linear_bwd(x, w, y, x, dw.to(DType::f64), b); }, "linear_bwd: dw has dtype f64");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, x, op_noncontiguous({5, 4}, DType::f32), b);
        },
        "linear_bwd: dw must be contiguous");
    expect_op_error([&] { linear_bwd(x, w, y, x, Tensor(), b); }, "linear_bwd: dw is undefined");
}

// dx undefined skips the input gradient; dbias undefined skips the bias gradient; dw still accumulates.
TEST(OpLinear, BackwardSkipsUndefinedGradients) {
    const uint64_t s = op_seed("OpLinear.BackwardSkipsUndefinedGradients");
    const Tensor x = op_randn({6, 5}, s, 0), w = op_randn({4, 5}, s, 1), dy = op_randn({6, 4}, s, 2);
    const Tensor dx = op_like(x), dw = op_like(w), dbias = Tensor::zeros({4}, DType::f64);
    linear_bwd(x, w, dy, dx, dw, dbias);
    const Tensor dw2 = op_like(w);
    linear_bwd(x, w, dy, Tensor(), dw2, Tensor());
    EXPECT_EQ(op_rho(dw2, dw), 0.0);
    linear_bwd(x, w, dy, Tensor(), dw2, Tensor());  // accumulates: now twice the gradient
    for (int64_t i = 0; i < dw.numel(); ++i)
        EXPECT_DOUBLE_EQ(core::tensor_get_flat(dw2, i), 2 * core::tensor_get_flat(dw, i));
}

// accumulate_dw false writes dw: what was there (NaN here) is not read, and the result has the bits of the sum into
// zeros; with no rows (N = 0) the written gradient is zero.
TEST(OpLinear, WrittenDwEqualsTheSumIntoZeros) {
    const uint64_t s = op_seed("OpLinear.WrittenDwEqualsTheSumIntoZeros");
    for (int64_t n : {0, 3, 300}) {
        const Tensor x = op_randn({n, 37}, s, 0).to(DType::f32), w = op_randn({19, 37}, s, 1).to(DType::f32);
        const Tensor dy = op_randn({n, 19}, s, 2).to(DType::f32);
        const Tensor added = Tensor::zeros(w.shape(), DType::f32), written = Tensor::zeros(w.shape(), DType::f32);
        written.fill(std::nan(""));
        linear_bwd(x, w, dy, Tensor(), added, Tensor());
        linear_bwd(x, w, dy, Tensor(), written, Tensor(), false, /*accumulate_dw=*/false);
        EXPECT_EQ(std::memcmp(added.raw(), written.raw(), added.nbytes()), 0) << "n = " << n;
    }
}

// An empty batch (N = 0) is a no-op that leaves the accumulated gradients alone; K = 0 gives y = bias.
TEST(OpLinear, EmptySizes) {
    const Tensor w = op_randn({3, 4}, 1, 0), dw = op_randn({3, 4}, 1, 1), dw0 = dw.clone();
    const Tensor x = Tensor::zeros({0, 4}, DType::f64), y = Tensor::zeros({0, 3}, DType::f64);
    linear_fwd(x, w, Tensor(), y);
    linear_bwd(x, w, y, op_like(x), dw, Tensor());
    EXPECT_EQ(op_rho(dw, dw0), 0.0);
    const Tensor x0 = Tensor::zeros({2, 0}, DType::f64), w0 = Tensor::zeros({3, 0}, DType::f64);
    const Tensor bias = op_randn({3}, 1, 2), y0 = Tensor::zeros({2, 3}, DType::f64);
    linear_fwd(x0, w0, bias, y0);
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(y0.at({i, j}), bias.at({j}));
}

// CUDA tensors go to the CUDA path; without a GPU that is one clear device error.
TEST(OpArgs, LinearCudaDispatch) {
    const Tensor x = op_cuda_view({3, 4}, DType::f32), w = op_cuda_view({5, 4}, DType::f32);
    const Tensor y = op_cuda_view({3, 5}, DType::f32);
    expect_op_error(
        [&] {
            linear_fwd(x, op_cuda_view({5, 3}, DType::f32), Tensor(), y);
        },
        "linear_fwd: w has shape [5, 3], expected [5, 4]");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, x, op_cuda_view({4, 4}, DType::f32), Tensor());
        },
        "linear_bwd: dw has shape [4, 4], expected [5, 4]");
    if (core::backend_available(core::Device::cuda)) return;
    expect_op_error([&] { linear_fwd(x, w, Tensor(), y); },
                    "linear_fwd: got cuda tensors, but no CUDA device is available",
                    core::ExitCode::device);
}

Tensor to_cuda(const Tensor& t, DType dtype) {
    return t.to(dtype).to_device(core::Device::cuda);
}
Tensor to_host(const Tensor& t) {
    return t.to_device(core::Device::cpu).to(DType::f64);
}
// a - b in f64 on the host.
Tensor host_minus(const Tensor& a, const Tensor& b) {
    const Tensor ha = to_host(a), hb = to_host(b), out = op_like(ha);
    for (int64_t i = 0; i < ha.numel(); ++i)
        core::tensor_set_flat(out, i, core::tensor_get_flat(ha, i) - core::tensor_get_flat(hb, i));
    return out;
}

void expect_rho(const std::string& name, const char* what, const Tensor& got, const Tensor& ref, double budget) {
    const double rho = op_rho(to_host(got), to_host(ref));
    std::printf("[ GPU PARITY ] %s %s: rho %.3e (budget %.0e)\n", name.c_str(), what, rho, budget);
    EXPECT_LE(rho, budget) << name << " " << what;  // NaN fails too
}

// The CUDA linear with inputs of `dtype` and "+=" grads of `grad_dtype` against the CPU f32 reference on the same
// rounded inputs. dx is poisoned with NaN (it must be written); dw and dbias start from random values and their
// increments are compared.
void linear_gpu_parity(int64_t n, int64_t k, int64_t m, bool bias, DType dtype, DType grad_dtype, double budget) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const std::string name = fmt::format("linear_gpu_n{}_k{}_m{}{}_{}_grad_{}",
                                         n,
                                         k,
                                         m,
                                         bias ? "_bias" : "",
                                         core::dtype_name(dtype),
                                         core::dtype_name(grad_dtype));
    const uint64_t s = op_seed(name);
    auto rounded = [&](const Tensor& t, DType d) { return t.to(d).to(DType::f32); };
    const Tensor x = rounded(op_randn({n, k}, s, 0), dtype);
    const Tensor w = rounded(op_randn({m, k}, s, 1, 0.0, 1.0 / std::sqrt(static_cast<double>(k))), dtype);
    const Tensor b = bias ? rounded(op_randn({m}, s, 2), dtype) : Tensor();
    const Tensor dy = rounded(op_randn({n, m}, s, 3), dtype);
    const Tensor dw0 = rounded(op_randn({m, k}, s, 4), grad_dtype), db0 = rounded(op_randn({m}, s, 5), grad_dtype);

    const Tensor y_ref = Tensor::zeros({n, m}, DType::f32), dx_ref = Tensor::zeros({n, k}, DType::f32);
    const Tensor dw_ref = dw0.clone(), db_ref = db0.clone();
    linear_fwd(x, w, b, y_ref);
    linear_bwd(x, w, dy, dx_ref, dw_ref, bias ? db_ref : Tensor());

    const Tensor xg = to_cuda(x, dtype), wg = to_cuda(w, dtype), dyg = to_cuda(dy, dtype);
    const Tensor bg = bias ? to_cuda(b, dtype) : Tensor();
    const Tensor yg = Tensor::zeros({n, m}, dtype, core::Device::cuda),
                 dxg = Tensor::zeros({n, k}, dtype, core::Device::cuda);
    yg.fill(std::nan(""));
    dxg.fill(std::nan(""));
    const Tensor dwg = to_cuda(dw0, grad_dtype), dbg = to_cuda(db0, grad_dtype);
    linear_fwd(xg, wg, bg, yg);
    linear_bwd(xg, wg, dyg, dxg, dwg, bias ? dbg : Tensor());
    expect_rho(name, "y", yg, y_ref, budget);
    expect_rho(name, "dx", dxg, dx_ref, budget);
    expect_rho(name, "dw (increment)", host_minus(dwg, dw0), host_minus(dw_ref, dw0), budget);
    if (bias) expect_rho(name, "dbias (increment)", host_minus(dbg, db0), host_minus(db_ref, db0), budget);
}

TEST(GpuLinear, ParityBf16) {
    linear_gpu_parity(1, 1, 1, false, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(1, 1, 1, true, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(7, 5, 3, true, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(131, 33, 37, true, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(5, 263, 259, true, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(257, 512, 384, true, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(1024, 1024, 768, false, DType::bf16, DType::f32, 1e-2);
    linear_gpu_parity(3000, 64, 1000, true, DType::bf16, DType::f32, 1e-2);  // dbias over three row chunks
}

TEST(GpuLinear, ParityBf16Grads) {
    linear_gpu_parity(131, 33, 37, true, DType::bf16, DType::bf16, 1e-2);
    linear_gpu_parity(256, 128, 64, true, DType::bf16, DType::bf16, 1e-2);
}

TEST(GpuLinear, ParityF32) {
    linear_gpu_parity(7, 5, 3, true, DType::f32, DType::f32, 1e-5);
    linear_gpu_parity(131, 33, 37, true, DType::f32, DType::f32, 1e-5);
    linear_gpu_parity(300, 256, 200, true, DType::f32, DType::f32, 1e-5);
}

// accumulate_dw false on the GPU (cuBLASLt's beta = 0): dw written over NaN equals the sum into zeros bitwise, for
// bf16 inputs with f32 and bf16 gradients and for f32; N = 0 writes zeros.
TEST(GpuLinear, WrittenDwEqualsTheSumIntoZeros) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const uint64_t s = op_seed("GpuLinear.WrittenDwEqualsTheSumIntoZeros");
    for (const auto& [dtype, grad_dtype] :
         {std::pair{DType::bf16, DType::f32}, std::pair{DType::bf16, DType::bf16}, std::pair{DType::f32, DType::f32}})
        for (int64_t n : {0, 5, 1000}) {
            const Tensor x = to_cuda(op_randn({n, 264}, s, 0), dtype), w = to_cuda(op_randn({136, 264}, s, 1), dtype);
            const Tensor dy = to_cuda(op_randn({n, 136}, s, 2), dtype);
            const Tensor added = Tensor::zeros(w.shape(), grad_dtype, core::Device::cuda);
            const Tensor written = Tensor::zeros(w.shape(), grad_dtype, core::Device::cuda);
            written.fill(std::nan(""));
            linear_bwd(x, w, dy, Tensor(), added, Tensor());
            linear_bwd(x, w, dy, Tensor(), written, Tensor(), false, /*accumulate_dw=*/false);
            const Tensor a = to_host(added), b = to_host(written);
            EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0)
                << core::dtype_name(dtype) << " inputs, " << core::dtype_name(grad_dtype) << " dw, n = " << n;
        }
}

// Empty sizes on the GPU: N = 0 leaves dw alone; K = 0 gives y = bias; M = 0 writes dx = 0.
TEST(GpuLinear, EmptySizes) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const auto cuda = core::Device::cuda;
    const Tensor w = to_cuda(op_randn({3, 4}, 1, 0), DType::bf16), dw = to_cuda(op_randn({3, 4}, 1, 1), DType::f32);
    const Tensor dw0 = dw.clone();
    const Tensor x = Tensor::zeros({0, 4}, DType::bf16, cuda), y = Tensor::zeros({0, 3}, DType::bf16, cuda);
    linear_fwd(x, w, Tensor(), y);
    linear_bwd(x, w, y, Tensor::zeros({0, 4}, DType::bf16, cuda), dw, Tensor());
    EXPECT_EQ(op_rho(to_host(dw), to_host(dw0)), 0.0);
    const Tensor bias = to_cuda(op_randn({3}, 1, 2), DType::bf16), y0 = Tensor::zeros({2, 3}, DType::bf16, cuda);
    linear_fwd(Tensor::zeros({2, 0}, DType::bf16, cuda), Tensor::zeros({3, 0}, DType::bf16, cuda), bias, y0);
    const Tensor hb = to_host(bias), hy = to_host(y0);
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(hy.at({i, j}), hb.at({j}));
    const Tensor dx = to_cuda(op_randn({2, 4}, 1, 3), DType::bf16);
    linear_bwd(to_cuda(op_randn({2, 4}, 1, 4), DType::bf16),
               Tensor::zeros({0, 4}, DType::bf16, cuda),
               Tensor::zeros({2, 0}, DType::bf16, cuda),
               dx,
               Tensor::zeros({0, 4}, DType::f32, cuda),
               Tensor());
    EXPECT_EQ(op_rho(to_host(dx), Tensor::zeros({2, 4}, DType::f64)), 0.0);
}

// Two runs of the backward give bitwise the same gradients (no split-K atomics, fixed-order dbias).
TEST(GpuLinear, Deterministic) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const int64_t n = 4096, k = 1024, m = 768;
    const Tensor x = to_cuda(op_randn({n, k}, 7, 0), DType::bf16), w = to_cuda(op_randn({m, k}, 7, 1), DType::bf16);
    const Tensor dy = to_cuda(op_randn({n, m}, 7, 2), DType::bf16);
    std::vector<Tensor> outs;
    for (int run = 0; run < 2; ++run) {
        const Tensor dx = Tensor::zeros({n, k}, DType::bf16, core::Device::cuda);
        const Tensor dw = Tensor::zeros({m, k}, DType::f32, core::Device::cuda);
        const Tensor db = Tensor::zeros({m}, DType::f32, core::Device::cuda);
        linear_bwd(x, w, dy, dx, dw, db);
        for (const Tensor& t : {dx, dw, db}) outs.push_back(t.to_device(core::Device::cpu));
    }
    for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(std::memcmp(outs[i].raw(), outs[i + 3].raw(), outs[i].nbytes()), 0) << "tensor " << i;
}

// The CUDA path's dtype rules: bf16 or f32 operands, grads f32 or the dtype of x.
TEST(GpuLinear, DtypeErrors) {
    if (!core::backend_available(core::Device::cuda)) GTEST_SKIP() << "no CUDA device: GPU parity needs a GPU";
    const auto cuda = core::Device::cuda;
    const Tensor x = Tensor::zeros({3, 4}, DType::bf16, cuda), w = Tensor::zeros({5, 4}, DType::bf16, cuda);
    const Tensor y = Tensor::zeros({3, 5}, DType::bf16, cuda);
    expect_op_error(
        [&] {
            linear_fwd(x, Tensor::zeros({5, 4}, DType::f32, cuda), Tensor(), y);
        },
        "linear_fwd: a tensor of shape [5, 4] has dtype f32, expected bf16 (the dtype of x)");
    expect_op_error([&] { linear_fwd(x.to(DType::f64), w.to(DType::f64), Tensor(), y.to(DType::f64)); },
                    "linear_fwd: x has dtype f64, expected bf16, f16 or f32");
    expect_op_error(
        [&] {
            linear_bwd(x, w, y, x, Tensor::zeros({5, 4}, DType::f16, cuda), Tensor());
        },
        "linear_bwd: dw has dtype f16, expected f32 or bf16 (the dtype of x)");
}

}  // namespace
}  // namespace mt::ops::test
