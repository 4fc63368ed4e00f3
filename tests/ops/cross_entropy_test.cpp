// Cases and argument checks of the fused softmax + cross-entropy (ops/cross_entropy.h): ignored rows, the in-place
// backward (dlogits aliasing logits), and out-of-range targets (exit 3).
#include "ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// Every third row (starting at row 1) gets ignore_index as its target.
OpCase cross_entropy_case(int64_t n, int64_t v, int32_t ignore_index, bool in_place) {
    const std::string name = fmt::format(
        "cross_entropy_n{}_v{}_ignore{}{}", n, v, ignore_index < 0 ? "neg" : "0", in_place ? "_inplace" : "");
    return {"cross_entropy", name, [=] {
                const uint64_t s = op_seed(name);
                Tensor targets = op_rand_ids({n}, s, 1, 0, static_cast<int32_t>(v));
                for (int64_t i = 1; i < n; i += 3) targets.data<int32_t>()[i] = ignore_index;
                OpProblem p;
                p.inputs = {{"logits", op_randn({n, v}, s, 0, 0.0, 2.0), GradKind::written},
                            {"targets", targets, GradKind::none}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor losses = op_stat_like(in[0], {n}), lse = op_stat_like(in[0], {n});
                    cross_entropy_fwd(in[0], in[1], ignore_index, losses, lse);
                    return std::vector<Tensor>{losses};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    Tensor losses = op_stat_like(in[0], {n}), lse = op_stat_like(in[0], {n});
                    cross_entropy_fwd(in[0], in[1], ignore_index, losses, lse);
                    if (in_place) {
                        grads[0].copy_from(in[0]);
                        cross_entropy_bwd(grads[0], in[1], lse, ignore_index, dout[0], grads[0]);
                    } else {
                        cross_entropy_bwd(in[0], in[1], lse, ignore_index, dout[0], grads[0]);
                    }
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(cross_entropy_case(1, 1, -100, false));
    op_register(cross_entropy_case(1, 2, -100, false));
    op_register(cross_entropy_case(7, 5, -100, false));
    op_register(cross_entropy_case(13, 257, -100, false));
    op_register(cross_entropy_case(13, 257, -100, true));
    op_register(cross_entropy_case(200, 257, -100, true));  // large enough to run on the OpenMP team
    op_register(cross_entropy_case(11, 3, 0, true));  // ignore_index is a class id: every row with target 0 is ignored
    // CUDA sizes: vocabularies of 32768 and more (one block per row, the 8-wide vector path), an odd vocabulary.
    op_register(op_parity_only(cross_entropy_case(64, 32768, -100, true)));
    op_register(op_parity_only(cross_entropy_case(37, 50257, -100, false)));
    op_register(op_parity_only(cross_entropy_case(16, 131072, -100, true)));
    return true;
}();

// The loss against -log softmax written out, with an ignored row and the saved lse.
TEST(OpCrossEntropy, MatchesFormula) {
    const Tensor logits = op_randn({3, 4}, 5, 0);
    Tensor targets = Tensor::zeros({3}, DType::i32);
    targets.data<int32_t>()[0] = 3;
    targets.data<int32_t>()[1] = -100;
    targets.data<int32_t>()[2] = 0;
    const Tensor losses = Tensor::zeros({3}, DType::f64), lse = op_like(losses);
    cross_entropy_fwd(logits, targets, -100, losses, lse);
    for (int64_t i = 0; i < 3; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 4; ++j) sum += std::exp(logits.at({i, j}));
        EXPECT_NEAR(lse.at({i}), std::log(sum), 1e-14);
    }
    EXPECT_NEAR(losses.at({0}), std::log(std::exp(lse.at({0}))) - logits.at({0, 3}), 1e-14);
    EXPECT_EQ(losses.at({1}), 0.0);
    EXPECT_NEAR(losses.at({2}), lse.at({2}) - logits.at({2, 0}), 1e-14);
    const Tensor dlosses = op_randn({3}, 5, 1), dlogits = op_like(logits);
    cross_entropy_bwd(logits, targets, lse, -100, dlosses, dlogits);
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(dlogits.at({1, j}), 0.0);
}

// A target outside [0, V) that is not ignore_index is bad label data: exit 3, naming the row and the value.
TEST(OpCrossEntropy, TargetOutOfRangeIsDataError) {
    const Tensor logits = Tensor::zeros({4, 5}, DType::f32), losses = Tensor::zeros({4}, DType::f32);
    const Tensor lse = op_like(losses);
    Tensor targets = Tensor::zeros({4}, DType::i32);
    targets.data<int32_t>()[1] = -100;
    cross_entropy_fwd(logits, targets, -100, losses, lse);
    targets.data<int32_t>()[3] = 5;
    expect_op_error([&] { cross_entropy_fwd(logits, targets, -100, losses, lse); },
                    "cross_entropy_fwd: targets[3] = 5 is outside [0, 5) and is not ignore_index (-100)",
                    core::ExitCode::data);
    expect_op_error([&] { cross_entropy_bwd(logits, targets, lse, -100, losses, op_like(logits)); },
                    "cross_entropy_bwd: targets[3] = 5",
                    core::ExitCode::data);
    targets.data<int32_t>()[3] = -1;
    expect_op_error(
        [&] { cross_entropy_fwd(logits, targets, -100, losses, lse); }, "targets[3] = -1", core::ExitCode::data);
    expect_op_error(
        [&] { cross_entropy_fwd(logits, targets, -1, losses, lse); }, "targets[1] = -100", core::ExitCode::data);
}

TEST(OpArgs, CrossEntropyShapesAndDtypes) {
    const Tensor logits = Tensor::zeros({4, 5}, DType::f32), losses = Tensor::zeros({4}, DType::f32);
    const Tensor lse = op_like(losses), targets = Tensor::zeros({4}, DType::i32), dlogits = op_like(logits);
    cross_entropy_fwd(logits, targets, -100, losses, lse);
    expect_op_error([&] { cross_entropy_fwd(logits, Tensor::zeros({3}, DType::i32), -100, losses, lse); },
                    "cross_entropy_fwd: targets has shape [3], expected [4]");
    expect_op_error([&] { cross_entropy_fwd(logits, targets.to(DType::i64), -100, losses, lse); },
                    "cross_entropy_fwd: targets has dtype i64, expected i32");
    expect_op_error([&] { cross_entropy_fwd(logits, targets, -100, losses.to(DType::f64), lse); },
                    "cross_entropy_fwd: losses has dtype f64, expected f32 (the dtype of logits)");
    expect_op_error([&] { cross_entropy_fwd(logits.to(DType::bf16), targets, -100, losses, lse); },
                    "cross_entropy_fwd: logits has dtype bf16");
    expect_op_error([&] { cross_entropy_fwd(logits, targets, -100, losses, Tensor::zeros({5}, DType::f32)); },
                    "cross_entropy_fwd: lse has shape [5], expected [4]");
    expect_op_error(
        [&] {
            cross_entropy_fwd(op_noncontiguous({4, 5}, DType::f32), targets, -100, losses, lse);
        },
        "cross_entropy_fwd: logits must be contiguous");
    expect_op_error(
        [&] {
            cross_entropy_fwd(Tensor::zeros({4, 0}, DType::f32), targets, -100, losses, lse);
        },
        "the vocabulary must not be empty");
    cross_entropy_bwd(logits, targets, lse, -100, losses, dlogits);
    expect_op_error(
        [&] {
            cross_entropy_bwd(logits, targets, lse, -100, losses, Tensor::zeros({4, 4}, DType::f32));
        },
        "cross_entropy_bwd: dlogits has shape [4, 4], expected [4, 5]");
    expect_op_error([&] { cross_entropy_bwd(logits, targets, lse, -100, losses.to(DType::f64), dlogits); },
                    "cross_entropy_bwd: dlosses has dtype f64, expected f32 (the dtype of logits)");
    expect_op_error(
        [&] {
            cross_entropy_bwd(logits, targets, lse, -100, losses, op_noncontiguous({4, 5}, DType::f32));
        },
        "cross_entropy_bwd: dlogits must be contiguous");
}

// On the GPU: a bad target is found on the device and reported as on the CPU (exit 3); statistics must be f32.
void cuda_errors() {
    const core::Device gpu = core::Device::cuda;
    const Tensor logits = Tensor::zeros({4, 5}, DType::bf16, gpu), losses = Tensor::zeros({4}, DType::f32, gpu);
    const Tensor lse = op_like(losses);
    Tensor targets = Tensor::zeros({4}, DType::i32);
    targets.data<int32_t>()[1] = -100;
    targets.data<int32_t>()[3] = 5;
    const Tensor targets_dev = targets.to_device(gpu);
    expect_op_error([&] { cross_entropy_fwd(logits, targets_dev, -100, losses, lse); },
                    "cross_entropy_fwd: targets[3] = 5 is outside [0, 5) and is not ignore_index (-100)",
                    core::ExitCode::data);
    expect_op_error([&] { cross_entropy_bwd(logits, targets_dev, lse, -100, losses, op_like(logits)); },
                    "cross_entropy_bwd: targets[3] = 5",
                    core::ExitCode::data);
    expect_op_error([&] { cross_entropy_fwd(logits, targets_dev, -100, losses.to(DType::bf16), lse); },
                    "cross_entropy_fwd: losses has dtype bf16, expected f32");
}

[[maybe_unused]] const bool kRegisteredCuda = [] {
    op_register_parity_check("cross_entropy", "cross_entropy_cuda_errors", cuda_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
