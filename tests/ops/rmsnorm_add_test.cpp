// The fused residual add of RMSNorm's forward (ops/rmsnorm.h: rmsnorm_fwd with residual and sum): h = x + residual
// written to sum and normalised. Harness cases through the fused forward and the backward the blocks pair with it
// (rmsnorm_bwd with dresidual: the stream's gradient reaches x and the residual alike); the fused forward equals the
// separate add and norm bit for bit on the CPU and on the GPU (OpParity, label gpu), with sum aliasing x; the
// argument errors.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/add.h"
#include "ops/rmsnorm.h"

namespace mt::ops::test {
namespace {

constexpr double kEps = 1e-5;

// Outputs y and h = x + residual; the gradients of x and residual are the same: dout[1] + the norm's gradient at h.
OpCase rmsnorm_add_case(int64_t n, int64_t c) {
    const std::string name = fmt::format("rmsnorm_add_n{}_c{}", n, c);
    return {"rmsnorm", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, c}, s, 0), GradKind::written},
                            {"residual", op_randn({n, c}, s, 1), GradKind::written},
                            {"weight", op_randn({c}, s, 2, 1.0, 0.2), GradKind::accumulated}};
                p.forward = [](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)}), h = op_like(in[0]);
                    rmsnorm_fwd(in[0], in[2], kEps, y, rstd, in[1], h);
                    return std::vector<Tensor>{y, h};
                };
                p.backward = [](const std::vector<Tensor>& in,
                                const std::vector<Tensor>& dout,
                                const std::vector<Tensor>& grads) {
                    Tensor y = op_like(in[0]), rstd = op_stat_like(in[0], {in[0].size(0)}), h = op_like(in[0]);
                    rmsnorm_fwd(in[0], in[2], kEps, y, rstd, in[1], h);
                    rmsnorm_bwd(h, in[2], rstd, dout[0], grads[0], grads[2], dout[1]);
                    grads[1].copy_from(grads[0]);
                };
                return p;
            }};
}

// The fused forward against add_fwd then rmsnorm_fwd, on `device` in `dtype`: y, rstd and h byte for byte; again
// with sum aliasing x (the stream updated in place).
void expect_fused_equals_separate(core::Device device, DType dtype, int64_t n, int64_t c) {
    const std::string what = fmt::format("{} {} n{} c{}", core::device_name(device), core::dtype_name(dtype), n, c);
    const DType stat = device == core::Device::cuda ? DType::f32 : dtype;
    const Tensor x = op_randn({n, c}, 3, 0).to(dtype).to_device(device);
    const Tensor r = op_randn({n, c}, 3, 1).to(dtype).to_device(device);
    const Tensor w = op_randn({c}, 3, 2, 1.0, 0.2).to(dtype).to_device(device);
    const Tensor h_ref = Tensor::zeros({n, c}, dtype, device), y_ref = op_like(h_ref);
    const Tensor rstd_ref = Tensor::zeros({n}, stat, device);
    add_fwd(x, r, h_ref);
    rmsnorm_fwd(h_ref, w, kEps, y_ref, rstd_ref);
    const Tensor h = op_like(h_ref), y = op_like(h_ref), rstd = op_like(rstd_ref);
    rmsnorm_fwd(x, w, kEps, y, rstd, r, h);
    EXPECT_TRUE(op_same_bytes(h, h_ref)) << what << " sum";
    EXPECT_TRUE(op_same_bytes(y, y_ref)) << what << " y";
    op_expect_parity("rmsnorm_add_fused_equals_separate " + what, "y", y, y_ref, 0.0);  // counted: rho exactly 0
    EXPECT_TRUE(op_same_bytes(rstd, rstd_ref)) << what << " rstd";
    const Tensor stream = x.clone(), y2 = op_like(h_ref), rstd2 = op_like(rstd_ref);
    rmsnorm_fwd(stream, w, kEps, y2, rstd2, r, stream);
    EXPECT_TRUE(op_same_bytes(stream, h_ref)) << what << " sum aliasing x";
    EXPECT_TRUE(op_same_bytes(y2, y_ref)) << what << " y, sum aliasing x";
}

void fused_equals_separate_cpu() {
    for (DType dtype : {DType::f32, DType::f64}) {
        expect_fused_equals_separate(core::Device::cpu, dtype, 7, 5);
        expect_fused_equals_separate(core::Device::cpu, dtype, 301, 130);
    }
}

void fused_equals_separate_cuda() {
    for (DType dtype : {DType::bf16, DType::f32}) {
        expect_fused_equals_separate(core::Device::cuda, dtype, 7, 5);       // scalar path
        expect_fused_equals_separate(core::Device::cuda, dtype, 257, 2048);  // 8-wide path
        expect_fused_equals_separate(core::Device::cuda, dtype, 67, 2049);   // odd width
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(rmsnorm_add_case(7, 5));
    op_register(rmsnorm_add_case(131, 16));
    op_register(op_parity_only(rmsnorm_add_case(257, 2048)));
    op_register(op_parity_only(rmsnorm_add_case(67, 2049)));
    op_register_check("rmsnorm", "rmsnorm_add_fused_equals_separate", fused_equals_separate_cpu);
    op_register_parity_check("rmsnorm", "rmsnorm_add_fused_equals_separate_cuda", fused_equals_separate_cuda);
    return true;
}();

TEST(OpArgs, RmsnormFusedAddArguments) {
    const Tensor x = Tensor::zeros({3, 4}, DType::f32), w = Tensor::zeros({4}, DType::f32);
    const Tensor y = op_like(x), rstd = Tensor::zeros({3}, DType::f32);
    expect_op_error([&] { rmsnorm_fwd(x, w, kEps, y, rstd, op_like(x)); },
                    "rmsnorm_fwd: residual and sum go together (the fused add writes x + residual to sum); sum is "
                    "missing");
    expect_op_error(
        [&] {
            rmsnorm_fwd(x, w, kEps, y, rstd, Tensor::zeros({3, 5}, DType::f32), op_like(x));
        },
        "rmsnorm_fwd: residual has shape [3, 5], expected [3, 4]");
    expect_op_error([&] { rmsnorm_fwd(x, w, kEps, y, rstd, op_like(x), op_like(x).to(DType::f64)); },
                    "rmsnorm_fwd: sum has dtype f64, expected f32 (the dtype of x)");
}

}  // namespace
}  // namespace mt::ops::test
