// ops/moe_balance.h: the counters against hand-computed values (they accumulate, out-of-range indices fail), the aux
// loss against its closed form at balance and its gradient against fp64 central finite differences, and CPU/CUDA
// parity of all four: the counts bit for bit, the float results by the parity metric.
#include "ops/moe_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

// Positive scores (sigmoid-like, in (0.05, 0.95)), a per-token cutoff inside their range, and K distinct experts
// per token.
Tensor routing_scores(int64_t n, int64_t e, uint64_t seed) {
    return op_uniform({n, e}, seed, 1, 0.05, 0.95);
}
Tensor routing_cutoff(int64_t n, uint64_t seed) {
    return op_uniform({n}, seed, 2, 0.3, 0.7);
}
Tensor routing_indices(int64_t n, int64_t k, int64_t e, uint64_t seed) {
    const Tensor first = op_rand_ids({n}, seed, 3, 0, static_cast<int32_t>(e));
    Tensor idx = Tensor::zeros({n, k}, DType::i32);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j)
            idx.data<int32_t>()[i * k + j] = static_cast<int32_t>((first.data<int32_t>()[i] + j) % e);
    return idx;
}

void counts_by_hand() {
    Tensor idx = Tensor::zeros({3, 2}, DType::i32);
    const int32_t v[] = {0, 2, 2, 1, 2, 0};
    std::copy(v, v + 6, idx.data<int32_t>());
    const Tensor counts = Tensor::zeros({4}, DType::i64);
    moe_expert_counts(idx, counts);
    moe_expert_counts(idx, counts);  // accumulates
    const int64_t want[] = {4, 2, 6, 0};
    for (int j = 0; j < 4; ++j) EXPECT_EQ(counts.data<int64_t>()[j], want[j]) << "expert " << j;
    idx.data<int32_t>()[3] = 4;
    expect_op_error([&] { moe_expert_counts(idx, counts); }, "indices[3] = 4 is outside [0, 4)");
}

void histogram_by_hand() {
    // r = c - s over [lower, upper) = [-1, 1) in 4 bins of width 0.5; below the range clamps to bin 0, above to bin
    // 3, NaN goes to bin 0.
    Tensor s = Tensor::zeros({2, 3}, DType::f64), c = Tensor::zeros({2}, DType::f64);
    const double sv[] = {0.9, 0.2, -2.0, std::numeric_limits<double>::quiet_NaN(), 0.5, 0.25};
    std::copy(sv, sv + 6, s.data<double>());
    c.data<double>()[0] = 0.0;  // r = -0.9, -0.2, 2.0 -> bins 0, 1, 3
    c.data<double>()[1] = 0.5;  // r = NaN, 0.0, 0.25 -> bins 0, 2, 2
    const Tensor hist = Tensor::zeros({3, 4}, DType::i64);
    moe_qb_histogram(s, c, -1.0, 1.0, hist);
    const int64_t want[3][4] = {{2, 0, 0, 0}, {0, 1, 1, 0}, {0, 0, 1, 1}};
    for (int j = 0; j < 3; ++j)
        for (int b = 0; b < 4; ++b) EXPECT_EQ(hist.data<int64_t>()[j * 4 + b], want[j][b]) << j << ", " << b;
    expect_op_error([&] { moe_qb_histogram(s, c, 1.0, 1.0, hist); }, "the bin range [1, 1] is empty");
}

void entropy_by_hand() {
    Tensor s = Tensor::zeros({2, 4}, DType::f64);
    s.fill(0.3);                                                               // token 0: uniform, entropy 1
    for (int j = 0; j < 4; ++j) s.data<double>()[4 + j] = j == 1 ? 1.0 : 0.0;  // token 1: one-hot, entropy 0
    const Tensor acc = Tensor::zeros({1}, DType::f64);
    acc.data<double>()[0] = 0.5;  // accumulates onto what is there
    moe_token_entropy_sum(s, acc);
    EXPECT_NEAR(acc.data<double>()[0], 1.5, 1e-15);
}

void aux_loss_at_balance() {
    // The aux loss is alpha at perfect balance with uniform scores; its gradient through P (sigmoid: p = s / sum s)
    // sums to zero over each token's experts.
    const int64_t t = 8, n = 4, k = 2;
    Tensor s = Tensor::zeros({t, n}, DType::f64), idx = Tensor::zeros({t, k}, DType::i32);
    s.fill(0.5);
    for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = static_cast<int32_t>(i % n);
    const Tensor ds = Tensor::zeros({t, n}, DType::f64);
    EXPECT_NEAR(moe_aux_loss(s, idx, 0.01, false, ds), 0.01, 1e-15);
    for (int64_t i = 0; i < t; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += ds.at({i, j});
        EXPECT_NEAR(sum, 0.0, 1e-15);
    }
    EXPECT_NEAR(moe_aux_loss(s, idx, 0.01, true, Tensor()), 0.01 * 0.5 * n, 1e-15);  // probs: P_j = 0.5
}

// d loss / d scores against fp64 central differences at every coordinate (the loss is smooth in the scores; the
// counts come from the fixed indices).
void aux_loss_finite_differences(bool probs) {
    const int64_t t = 7, n = 5, k = 2;
    const uint64_t seed = op_seed(probs ? "moe_aux_loss_fd_probs" : "moe_aux_loss_fd");
    const Tensor s = routing_scores(t, n, seed), idx = routing_indices(t, k, n, seed);
    const Tensor ds = Tensor::zeros({t, n}, DType::f64);
    moe_aux_loss(s, idx, 0.3, probs, ds);
    const double h = 1e-6;
    double worst = 0.0;
    for (int64_t q = 0; q < t * n; ++q) {
        const Tensor plus = s.clone(), minus = s.clone();
        plus.data<double>()[q] += h;
        minus.data<double>()[q] -= h;
        const double fd =
            (moe_aux_loss(plus, idx, 0.3, probs, Tensor()) - moe_aux_loss(minus, idx, 0.3, probs, Tensor())) / (2 * h);
        const double an = ds.data<double>()[q];
        worst = std::max(worst, std::abs(fd - an) / std::max(1e-3, std::abs(an)));
    }
    EXPECT_LE(worst, 1e-6) << "aux loss gradient vs central differences (probs = " << probs << ")";
}

// A token group per row (1 for every third token, else 0): the per-modality counting of multimodal.md §4.
Tensor routing_groups(int64_t n) {
    Tensor g = Tensor::zeros({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) g.data<int32_t>()[i] = i % 3 == 0 ? 1 : 0;
    return g;
}

// The rows of t (dim 0) whose group is keep.
Tensor rows_of_group(const Tensor& t, const Tensor& group, int32_t keep) {
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < group.numel(); ++i)
        if (group.data<int32_t>()[i] == keep) rows.push_back(i);
    core::Shape shape = t.shape();
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor out = Tensor::zeros(shape, t.dtype());
    const int64_t row = t.numel() / std::max<int64_t>(t.size(0), 1);
    const size_t bytes = static_cast<size_t>(row) * core::dtype_size(t.dtype());
    for (size_t r = 0; r < rows.size(); ++r)
        std::memcpy(static_cast<char*>(out.raw()) + r * bytes,
                    static_cast<const char*>(t.raw()) + static_cast<size_t>(rows[r]) * bytes,
                    bytes);
    return out;
}

// With a group, the counts and the histogram are those of the group's rows alone, bit for bit.
void grouped_counts_equal_the_groups_rows() {
    const int64_t n = 23, e = 5, k = 2, bins = 7;
    const uint64_t seed = op_seed("moe_balance_grouped");
    const Tensor s = routing_scores(n, e, seed), c = routing_cutoff(n, seed), idx = routing_indices(n, k, e, seed);
    const Tensor group = routing_groups(n);
    for (int32_t keep : {0, 1}) {
        const Tensor counts = Tensor::zeros({e}, DType::i64), want = Tensor::zeros({e}, DType::i64);
        moe_expert_counts(idx, counts, group, keep);
        moe_expert_counts(rows_of_group(idx, group, keep), want);
        EXPECT_TRUE(op_same_bytes(counts, want)) << "counts of group " << keep;
        const Tensor hist = Tensor::zeros({e, bins}, DType::i64), want_hist = Tensor::zeros({e, bins}, DType::i64);
        moe_qb_histogram(s, c, -0.6, 0.9, hist, group, keep);
        moe_qb_histogram(rows_of_group(s, group, keep), rows_of_group(c, group, keep), -0.6, 0.9, want_hist);
        EXPECT_TRUE(op_same_bytes(hist, want_hist)) << "histogram of group " << keep;
    }
    expect_op_error([&] { moe_expert_counts(idx, Tensor::zeros({e}, DType::i64), routing_groups(n - 1), 0); },
                    "moe_expert_counts: group has shape [22], expected [23]");
}

// CUDA against the CPU reference on the same rounded scores.
void parity(DType dtype, int64_t n, int64_t e, int64_t k, int64_t bins) {
    const std::string name = fmt::format("moe_balance_{}_n{}_e{}", core::dtype_name(dtype), n, e);
    const uint64_t seed = op_seed(name);
    const Tensor s = routing_scores(n, e, seed).to(dtype).to(DType::f32);
    const Tensor c = routing_cutoff(n, seed).to(dtype).to(DType::f32);
    const Tensor idx = routing_indices(n, k, e, seed);
    const auto dev = [&](const Tensor& t) {
        return t.to(t.dtype() == DType::f32 ? dtype : t.dtype()).to_device(core::Device::cuda);
    };
    const Tensor s_d = dev(s), c_d = dev(c), idx_d = idx.to_device(core::Device::cuda);

    const Tensor counts = Tensor::zeros({e}, DType::i64), counts_d = Tensor::zeros({e}, DType::i64, core::Device::cuda);
    moe_expert_counts(idx, counts);
    moe_expert_counts(idx_d, counts_d);
    EXPECT_TRUE(op_same_bytes(counts_d, counts)) << name << ": expert counts differ";

    const Tensor hist = Tensor::zeros({e, bins}, DType::i64);
    const Tensor hist_d = Tensor::zeros({e, bins}, DType::i64, core::Device::cuda);
    moe_qb_histogram(s, c, -0.6, 0.9, hist);
    moe_qb_histogram(s_d, c_d, -0.6, 0.9, hist_d);
    EXPECT_TRUE(op_same_bytes(hist_d, hist)) << name << ": QB histograms differ";

    const Tensor group = routing_groups(n), group_d = group.to_device(core::Device::cuda);
    for (int32_t keep : {0, 1}) {
        const Tensor gc = Tensor::zeros({e}, DType::i64), gc_d = Tensor::zeros({e}, DType::i64, core::Device::cuda);
        moe_expert_counts(idx, gc, group, keep);
        moe_expert_counts(idx_d, gc_d, group_d, keep);
        EXPECT_TRUE(op_same_bytes(gc_d, gc)) << name << ": grouped expert counts differ (group " << keep << ")";
        const Tensor gh = Tensor::zeros({e, bins}, DType::i64);
        const Tensor gh_d = Tensor::zeros({e, bins}, DType::i64, core::Device::cuda);
        moe_qb_histogram(s, c, -0.6, 0.9, gh, group, keep);
        moe_qb_histogram(s_d, c_d, -0.6, 0.9, gh_d, group_d, keep);
        EXPECT_TRUE(op_same_bytes(gh_d, gh)) << name << ": grouped QB histograms differ (group " << keep << ")";
    }

    const Tensor acc = Tensor::zeros({1}, DType::f64), acc_d = Tensor::zeros({1}, DType::f64, core::Device::cuda);
    moe_token_entropy_sum(s, acc);
    moe_token_entropy_sum(s_d, acc_d);
    op_expect_parity(name, "token entropy sum", acc_d, acc, 1e-9);

    const double budget = dtype == DType::f32 ? 1e-5 : 1e-2;  // dscores is stored in the scores' dtype
    for (bool probs : {false, true}) {
        const Tensor ds = Tensor::zeros({n, e}, DType::f32), ds_d = Tensor::zeros({n, e}, dtype, core::Device::cuda);
        Tensor loss = Tensor::zeros({1}, DType::f64), loss_d = Tensor::zeros({1}, DType::f64);
        loss.data<double>()[0] = moe_aux_loss(s, idx, 0.01, probs, ds);
        loss_d.data<double>()[0] = moe_aux_loss(s_d, idx_d, 0.01, probs, ds_d);
        op_expect_parity(name, probs ? "aux loss (probs)" : "aux loss", loss_d, loss, 1e-5);
        op_expect_parity(name, probs ? "d scores (probs)" : "d scores", ds_d, ds, budget);
    }
}

[[maybe_unused]] const bool kRegistered = [] {
    op_register_check("moe_balance", "moe_expert_counts_by_hand", counts_by_hand);
    op_register_check("moe_balance", "moe_qb_histogram_by_hand", histogram_by_hand);
    op_register_check("moe_balance", "moe_token_entropy_sum_by_hand", entropy_by_hand);
    op_register_check("moe_balance", "moe_grouped_counts_equal_the_groups_rows", grouped_counts_equal_the_groups_rows);
    op_register_check("moe_balance", "moe_aux_loss_at_balance", aux_loss_at_balance);
    op_register_check("moe_balance", "moe_aux_loss_finite_differences", [] { aux_loss_finite_differences(false); });
    op_register_check(
        "moe_balance", "moe_aux_loss_finite_differences_probs", [] { aux_loss_finite_differences(true); });
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
        const std::string d(core::dtype_name(dtype));
        op_register_parity_check(
            "moe_balance", "moe_balance_" + d + "_n37_e8", [dtype] { parity(dtype, 37, 8, 2, 16); });
        op_register_parity_check(
            "moe_balance", "moe_balance_" + d + "_n5000_e129", [dtype] { parity(dtype, 5000, 129, 6, 64); });
    }
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
