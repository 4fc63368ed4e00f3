// Cases and checks of the MoE permutation (ops/moe_permute.h): the gather and its backward through the harness, the
// plan on hand-built routings (row order, both capacity policies), and permute then unpermute as the identity.
#include "ops/moe_permute.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/rng.h"
#include "op_harness.h"
#include "ops/moe_unpermute.h"

namespace mt::ops::test {
namespace {

// Indices [n, k] i32: k distinct experts per token, drawn from Philox (a partial Fisher-Yates per row).
Tensor random_routing(int64_t n, int64_t e, int64_t k, uint64_t seed) {
    Tensor idx = Tensor::zeros({n, k}, DType::i32);
    std::vector<int32_t> perm(static_cast<size_t>(e));
    for (int64_t i = 0; i < n; ++i) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t q = 0; q < k; ++q) {
            const uint64_t span = static_cast<uint64_t>(e - q);
            const int64_t j = q + static_cast<int64_t>(core::rng_u64(seed, 7, static_cast<uint64_t>(i * k + q)) % span);
            std::swap(perm[static_cast<size_t>(q)], perm[static_cast<size_t>(j)]);
            core::tensor_set_flat(idx, i * k + q, perm[static_cast<size_t>(q)]);
        }
    }
    return idx;
}

// The plan's tensors for a routing.
struct Plan {
    Tensor offsets, slot_row, row_token;
    int64_t rows = 0;
};

// The plan on idx's device.
Plan make_plan(const Tensor& idx, const Tensor& gates, int64_t e, int64_t capacity, MoeDropPolicy policy) {
    const int64_t n = idx.size(0), k = idx.size(1);
    const core::Device d = idx.device();
    Plan p{Tensor::zeros({e + 1}, DType::i32, d),
           Tensor::zeros({n, k}, DType::i32, d),
           Tensor::zeros({n * k}, DType::i32, d)};
    p.rows = moe_permute_plan(idx, gates, e, capacity, policy, p.offsets, p.slot_row, p.row_token);
    return p;
}

OpCase permute_case(int64_t n, int64_t e, int64_t k, int64_t c, int64_t capacity) {
    const std::string name = fmt::format("moe_permute_n{}_e{}_k{}_c{}_cap{}", n, e, k, c, capacity);
    return {"moe_permute", name, [=] {
                const uint64_t s = op_seed(name);
                OpProblem p;
                p.inputs = {{"x", op_randn({n, c}, s, 0), GradKind::written},
                            {"gates", op_uniform({n, k}, s, 1, 0.1, 1.0), GradKind::none}};
                const Tensor idx = random_routing(n, e, k, s);
                auto plan = [=](const std::vector<Tensor>& in) {
                    return make_plan(idx.to_device(in[0].device()), in[1], e, capacity, MoeDropPolicy::probs);
                };
                p.forward = [=](const std::vector<Tensor>& in) {
                    const Plan pl = plan(in);
                    Tensor xp = op_like(in[0], {pl.rows, c});
                    moe_permute_fwd(in[0], pl.row_token.slice(0, 0, pl.rows), xp);
                    return std::vector<Tensor>{xp};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    moe_permute_bwd(plan(in).slot_row, dout[0], grads[0]);
                };
                return p;
            }};
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register(permute_case(1, 1, 1, 1, 0));
    op_register(permute_case(7, 5, 2, 3, 0));
    op_register(permute_case(13, 8, 3, 5, 4));  // capacity 4 < 13 * 3 / 8: drops
    op_register(permute_case(97, 16, 4, 67, 0));
    // the CUDA plan and gathers: several plan chunks, many and empty experts, capacity with drops
    op_register(op_parity_only(permute_case(4096, 256, 8, 64, 0)));
    op_register(op_parity_only(permute_case(7, 256, 2, 16, 0)));  // 242 or more empty experts
    op_register(op_parity_only(permute_case(3001, 64, 8, 40, 300)));
    return true;
}();

// Row order within an expert is ascending (token, slot); capacity keeps the largest gates (ties by token) or the first
// rows in token order.
TEST(MoePermutePlan, OrderAndCapacity) {
    // tokens 0..3, k = 2; expert 1 is chosen by every token
    const std::vector<int32_t> routing = {1, 0, 2, 1, 1, 3, 0, 1};
    const std::vector<double> gate_values = {0.5, 0.5, 0.3, 0.9, 0.9, 0.1, 0.2, 0.4};
    Tensor idx = Tensor::zeros({4, 2}, DType::i32), gates = Tensor::zeros({4, 2}, DType::f32);
    for (int64_t s = 0; s < 8; ++s) {
        core::tensor_set_flat(idx, s, routing[static_cast<size_t>(s)]);
        core::tensor_set_flat(gates, s, gate_values[static_cast<size_t>(s)]);
    }
    auto ints = [](const Tensor& t, int64_t n) {
        std::vector<int> v;
        for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int>(core::tensor_get_flat(t, i)));
        return v;
    };
    const Plan all = make_plan(idx, Tensor(), 4, 0, MoeDropPolicy::probs);
    EXPECT_EQ(all.rows, 8);
    EXPECT_EQ(ints(all.offsets, 5), (std::vector<int>{0, 2, 6, 7, 8}));
    EXPECT_EQ(ints(all.row_token, 8), (std::vector<int>{0, 3, 0, 1, 2, 3, 1, 2}));
    EXPECT_EQ(ints(all.slot_row, 8), (std::vector<int>{2, 0, 6, 3, 4, 7, 1, 5}));
    // capacity 2, probs: expert 1 keeps tokens 1 and 2 (gates 0.9); tokens 0 (0.5) and 3 (0.4) drop
    const Plan probs = make_plan(idx, gates, 4, 2, MoeDropPolicy::probs);
    EXPECT_EQ(probs.rows, 6);
    EXPECT_EQ(ints(probs.offsets, 5), (std::vector<int>{0, 2, 4, 5, 6}));
    EXPECT_EQ(ints(probs.slot_row, 8), (std::vector<int>{-1, 0, 4, 2, 3, 5, 1, -1}));
    EXPECT_EQ(ints(probs.row_token, 8), (std::vector<int>{0, 3, 1, 2, 1, 2, -1, -1}));
    // capacity 2, position: expert 1 keeps tokens 0 and 1
    const Plan pos = make_plan(idx, Tensor(), 4, 2, MoeDropPolicy::position);
    EXPECT_EQ(ints(pos.slot_row, 8), (std::vector<int>{2, 0, 4, 3, -1, 5, 1, -1}));
}

// Permute then unpermute with gates 1 (k = 1) or 1/2 (k = 2) gives x back bitwise.
TEST(MoePermutePlan, PermuteThenUnpermuteIsIdentity) {
    for (int64_t k : {1, 2}) {
        const int64_t n = 37, e = 6, c = 11;
        const Tensor x = op_randn({n, c}, 5, 0).to(DType::f32);
        const Plan pl = make_plan(random_routing(n, e, k, 9), Tensor(), e, 0, MoeDropPolicy::probs);
        const Tensor xp = Tensor::zeros({pl.rows, c}, DType::f32), y = op_like(x);
        moe_permute_fwd(x, pl.row_token.slice(0, 0, pl.rows), xp);
        const Tensor gates = Tensor::zeros({n, k}, DType::f32);
        gates.fill(1.0 / static_cast<double>(k));
        moe_unpermute_fwd(xp, pl.slot_row, gates, y);
        EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << "k = " << k;
    }
}

TEST(OpArgs, MoePermuteShapesAndIndices) {
    const Tensor idx = Tensor::zeros({3, 2}, DType::i32);
    core::tensor_set_flat(idx, 3, 5);
    Plan p{Tensor::zeros({5}, DType::i32), Tensor::zeros({3, 2}, DType::i32), Tensor::zeros({6}, DType::i32)};
    expect_op_error(
        [&] { moe_permute_plan(idx, Tensor(), 4, 0, MoeDropPolicy::probs, p.offsets, p.slot_row, p.row_token); },
        "moe_permute_plan: indices[3] = 5 is outside [0, 4)");
    core::tensor_set_flat(idx, 3, 1);
    expect_op_error(
        [&] { moe_permute_plan(idx, Tensor(), 4, 2, MoeDropPolicy::probs, p.offsets, p.slot_row, p.row_token); },
        "moe_permute_plan: gates is undefined");
    const Tensor x = Tensor::zeros({3, 4}, DType::f64), xp = Tensor::zeros({6, 4}, DType::f64);
    expect_op_error([&] { moe_permute_fwd(x, p.row_token, xp.to(DType::f32)); },
                    "moe_permute_fwd: xp has dtype f32, expected f64 (the dtype of x)");
    p.row_token.fill(3);
    expect_op_error([&] { moe_permute_fwd(x, p.row_token, xp); },
                    "moe_permute_fwd: row_token[0] = 3 is outside [0, 3)");
    expect_op_error(
        [&] {
            moe_permute_bwd(p.slot_row, xp, Tensor::zeros({3, 5}, DType::f64));
        },
        "moe_permute_bwd: dx has shape [3, 5], expected [3, 4]");
    expect_op_error(
        [&] {
            moe_permute_fwd(op_cuda_view({3, 4}, DType::f32), p.row_token, xp);
        },
        "all tensors of one call must be on the same device");
}

}  // namespace
}  // namespace mt::ops::test
