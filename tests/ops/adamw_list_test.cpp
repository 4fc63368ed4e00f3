// ops::adamw_step_list: the optimizer's list form of the AdamW step. On the CPU it is the per-piece step, bit for
// bit (each piece's weight decay on or off, its own rounding stream); on CUDA its launches of up to 32 pieces, a block
// per chunk of a piece, match the CPU reference (OpParity, label gpu), with more pieces than one launch takes, sizes
// that are not whole vectors or chunks, bf16 moments and model copies, and the per-piece squared sums.
#include <gtest/gtest.h>

#include "op_harness.h"
#include "ops/adamw.h"

namespace mt::ops::test {
namespace {

// A list over slices of flat buffers (as the optimizer's arena): piece i has sizes[i] elements, weight decay on the
// even pieces, a rounding stream of its own and its two squared-sum slots.
struct Buffers {
    Tensor param, grad, m, v, copy, sums;
    std::vector<int64_t> sizes;
    std::vector<AdamWPiece> list() const {
        std::vector<AdamWPiece> out;
        int64_t at = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
            auto part = [&](const Tensor& t) { return t.defined() ? t.slice(0, at, at + sizes[i]) : Tensor(); };
            const auto k = static_cast<int64_t>(i);
            out.push_back({.param = part(param),
                           .grad = part(grad),
                           .m = part(m),
                           .v = part(v),
                           .param_copy = part(copy),
                           .decay = i % 2 == 0,
                           .rounding = {.seed = 77 + i, .first = 1000 * k},
                           .update_sq = sums.slice(0, 2 * k, 2 * k + 1),
                           .param_sq = sums.slice(0, 2 * k + 1, 2 * k + 2)});
            at += sizes[i];
        }
        return out;
    }
    Buffers to(core::Device device) const {
        auto move = [&](const Tensor& t) { return t.defined() ? t.to_device(device) : Tensor(); };
        return {move(param), move(grad), move(m), move(v), move(copy), move(sums), sizes};
    }
    Buffers clone() const {
        auto copy_of = [](const Tensor& t) { return t.defined() ? t.clone() : Tensor(); };
        return {copy_of(param), copy_of(grad), copy_of(m), copy_of(v), copy_of(copy), copy_of(sums), sizes};
    }
};

Buffers make(const std::vector<int64_t>& sizes, DType dtype, DType state, DType copy) {
    int64_t n = 0;
    for (int64_t s : sizes) n += s;
    Buffers b;
    b.sizes = sizes;
    b.param = op_randn({n}, 5, 0).to(dtype);
    b.grad = op_randn({n}, 5, 1).to(dtype);
    b.m = op_randn({n}, 5, 2, 0.0, 0.1).to(state);
    b.v = op_uniform({n}, 5, 3, 0.0, 0.1).to(state);
    if (copy != DType::u8) b.copy = Tensor::zeros({n}, copy);
    b.sums = Tensor::zeros({2 * static_cast<int64_t>(sizes.size())}, DType::f64);
    return b;
}

AdamWHyper hyper() {
    AdamWHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1;
    return h;
}

// The CPU list is the per-piece step, byte for byte: f64, f32 and bf16 moments, two steps.
void list_is_the_pieces() {
    const std::vector<int64_t> sizes = {5, 40009, 16, 1};
    for (const auto& [dtype, state] :
         {std::pair{DType::f64, DType::f64}, std::pair{DType::f32, DType::f32}, std::pair{DType::f32, DType::bf16}}) {
        const Buffers a = make(sizes, dtype, state, DType::u8), b = a.clone();
        for (int64_t step = 1; step <= 2; ++step) {
            adamw_step_list(a.list(), hyper(), step, 0.7);
            AdamWHyper plain = hyper();
            plain.weight_decay = 0.0;
            for (const AdamWPiece& p : b.list())
                adamw_step(p.param,
                           p.grad,
                           p.m,
                           p.v,
                           p.decay ? hyper() : plain,
                           step,
                           0.7,
                           {},
                           p.rounding,
                           p.update_sq,
                           p.param_sq);
        }
        const std::string what = fmt::format("{} param, {} state", core::dtype_name(dtype), core::dtype_name(state));
        EXPECT_TRUE(op_same_bytes(a.param, b.param)) << what;
        EXPECT_TRUE(op_same_bytes(a.m, b.m)) << what;
        EXPECT_TRUE(op_same_bytes(a.v, b.v)) << what;
        EXPECT_TRUE(op_same_bytes(a.sums, b.sums)) << what;
        EXPECT_GT(core::tensor_get_flat(a.sums, 3), 0.0) << what;
    }
}

void list_errors() {
    const Buffers b = make({4, 4}, DType::f32, DType::f32, DType::u8);
    std::vector<AdamWPiece> list = b.list();
    list[1].grad = Tensor::zeros({4}, DType::f64);
    expect_op_error([&] { adamw_step_list(list, hyper(), 1, 1.0); },
                    "adamw_step_list (piece 1): grad has dtype f64, expected f32 (the dtype of piece 0's grad)");
    list = b.list();
    list[0].m = Tensor::zeros({3}, DType::f32);
    expect_op_error([&] { adamw_step_list(list, hyper(), 1, 1.0); },
                    "adamw_step_list (piece 0): m has shape [3], expected [4]");
    list = b.list();
    list[1].param_copy = Tensor::zeros({4}, DType::bf16);
    expect_op_error(
        [&] { adamw_step_list(list, hyper(), 1, 1.0); },
        "adamw_step_list (piece 1): param_copy given but piece 0's missing: every piece has a copy or none");
    list = b.list();
    expect_op_error([&] { adamw_step_list(list, hyper(), 0, 1.0); }, "adamw_step_list: step = 0 must be >= 1");
}

// CUDA against the CPU per-piece reference: 46 pieces (two launches), sizes from 1 to past two chunks, f32 and bf16
// gradients (the CPU sees the same rounded values), f32 and bf16 moments, no copy and bf16 / f32 copies, two steps.
void list_parity() {
    std::vector<int64_t> sizes = {1, 7, 1003, 131077, 65536, 8};
    for (int i = 0; i < 40; ++i) sizes.push_back(24 + i % 3);
    struct Variant {
        DType grad, state, copy;
    };
    for (const Variant& k : {Variant{DType::f32, DType::f32, DType::bf16},
                             Variant{DType::bf16, DType::f32, DType::u8},
                             Variant{DType::bf16, DType::bf16, DType::f32}}) {
        const std::string name = fmt::format("adamw_list_grad_{}_state_{}_copy_{}",
                                             core::dtype_name(k.grad),
                                             core::dtype_name(k.state),
                                             k.copy == DType::u8 ? "none" : core::dtype_name(k.copy));
        const Buffers cpu = make(sizes, DType::f32, k.state, k.copy);
        Buffers dev = cpu.to(core::Device::cuda);
        dev.grad = cpu.grad.to(k.grad).to_device(core::Device::cuda);
        const Tensor cpu_grad = cpu.grad.to(k.grad).to(DType::f32);  // the values the device reads
        Buffers ref = cpu;
        ref.grad = cpu_grad;
        for (int64_t step = 1; step <= 2; ++step) {
            adamw_step_list(dev.list(), hyper(), step, 0.6);
            adamw_step_list(ref.list(), hyper(), step, 0.6);
        }
        op_expect_parity(name, "param", dev.param, ref.param, 1e-5);
        // bf16 moments: the same random bits, but an f32 value an ulp apart can round to the neighbouring bf16.
        const double state_budget = k.state == DType::bf16 ? 1e-2 : 1e-5;
        op_expect_parity(name, "m", dev.m, ref.m, state_budget);
        op_expect_parity(name, "v", dev.v, ref.v, state_budget);
        if (k.copy != DType::u8)
            op_expect_parity(name, "param_copy", dev.copy, ref.copy, k.copy == DType::bf16 ? 1e-2 : 1e-5);
        // Per piece: the update's squared change (single elements carry 4e-5 of rounding, adamw_test's parity) and
        // the squared weights.
        for (size_t i = 0; i < sizes.size(); ++i) {
            const auto s = static_cast<int64_t>(2 * i);
            op_expect_parity(name,
                             fmt::format("update_sq[{}]", i),
                             dev.sums.slice(0, s, s + 1),
                             ref.sums.slice(0, s, s + 1),
                             sizes[i] < 64 ? 1e-4 : 1e-5);
            op_expect_parity(name,
                             fmt::format("param_sq[{}]", i),
                             dev.sums.slice(0, s + 1, s + 2),
                             ref.sums.slice(0, s + 1, s + 2),
                             1e-6);
        }
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_check("adamw", "adamw_list_is_the_pieces", list_is_the_pieces);
    op_register_check("adamw", "adamw_list_errors", list_errors);
    op_register_parity_check("adamw", "adamw_list_cpu_vs_cuda", list_parity);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
