// Cases and argument checks of the MoE combine (ops/moe_unpermute.h): gradients through the expert rows and the
// gates, dropless and with dropped slots.
#include "ops/moe_unpermute.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "op_harness.h"
#include "ops/moe_permute.h"

namespace mt::ops::test {
namespace {

// slot_row [n, k] of a routing where token i's slot q goes to expert (i + 3q) % e, planned with the given capacity
// (the "position" policy); returns the number of rows.
std::pair<Tensor, int64_t> slot_rows(int64_t n, int64_t e, int64_t k, int64_t capacity) {
    Tensor idx = Tensor::zeros({n, k}, DType::i32);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t q = 0; q < k; ++q) core::tensor_set_flat(idx, i * k + q, static_cast<double>((i + 3 * q) % e));
    Tensor offsets = Tensor::zeros({e + 1}, DType::i32), slot = Tensor::zeros({n, k}, DType::i32),
           tokens = Tensor::zeros({n * k}, DType::i32);
    const int64_t rows = moe_permute_plan(idx, Tensor(), e, capacity, MoeDropPolicy::position, offsets, slot, tokens);
    return {slot, rows};
}

OpCase unpermute_case(int64_t n, int64_t e, int64_t k, int64_t c, int64_t capacity) {
    const std::string name = fmt::format("moe_unpermute_n{}_e{}_k{}_c{}_cap{}", n, e, k, c, capacity);
    return {"moe_unpermute", name, [=] {
                const uint64_t s = op_seed(name);
                const auto [slot, rows] = slot_rows(n, e, k, capacity);
                OpProblem p;
                p.inputs = {{"yp", op_randn({rows, c}, s, 0), GradKind::written},
                            {"gates", op_uniform({n, k}, s, 1, 0.1, 1.5), GradKind::written}};
                p.forward = [=, slot = slot](const std::vector<Tensor>& in) {
                    Tensor y = op_like(in[0], {n, c});
                    moe_unpermute_fwd(in[0], slot.to_device(in[0].device()), in[1], y);
                    return std::vector<Tensor>{y};
                };
                p.backward = [slot = slot](const std::vector<Tensor>& in,
                                           const std::vector<Tensor>& dout,
                                           const std::vector<Tensor>& grads) {
                    moe_unpermute_bwd(in[0], slot.to_device(in[0].device()), in[1], dout[0], grads[0], grads[1]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(unpermute_case(1, 1, 1, 1, 0));
    op_register(unpermute_case(7, 5, 2, 3, 0));
    op_register(unpermute_case(13, 4, 3, 5, 6));  // capacity 6 < 13 * 3 / 4: dropped slots get dgates = 0
    op_register(unpermute_case(101, 16, 4, 67, 0));
    // the CUDA kernels at the benchmark's shape class: top 8 of 64 experts, a row width the 8-wide loads take
    op_register(op_parity_only(unpermute_case(2048, 64, 8, 256, 0)));
    op_register(op_parity_only(unpermute_case(1000, 256, 8, 130, 40)));  // dropped slots, odd row width
    return true;
}();

TEST(OpArgs, MoeUnpermuteShapesAndDtypes) {
    const auto [slot, rows] = slot_rows(3, 4, 2, 0);
    const Tensor yp = Tensor::zeros({rows, 5}, DType::f64), g = Tensor::zeros({3, 2}, DType::f64);
    const Tensor y = Tensor::zeros({3, 5}, DType::f64);
    moe_unpermute_fwd(yp, slot, g, y);
    expect_op_error([&] { moe_unpermute_fwd(yp, slot, g.to(DType::f32), y); },
                    "moe_unpermute_fwd: gates has dtype f32, expected f64 (the dtype of yp)");
    expect_op_error([&] { moe_unpermute_fwd(yp.slice(0, 0, 4).clone(), slot, g, y); }, "moe_unpermute_fwd: slot_row[");
    expect_op_error(
        [&] {
            moe_unpermute_bwd(yp, slot, g, y, op_like(yp), Tensor::zeros({3, 3}, DType::f64));
        },
        "moe_unpermute_bwd: dgates has shape [3, 3], expected [3, 2]");
    expect_op_error(
        [&] {
            moe_unpermute_fwd(op_cuda_view({6, 5}, DType::f32), slot, g, y);
        },
        "all tensors of one call must be on the same device");
}

}  // namespace
}  // namespace mt::ops::test
