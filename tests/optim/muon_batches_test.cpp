// optim::Muon's batches (muon.h): the small entries of one shape and decay flag run as one ops::muon_step, a large
// stack alone; the result is bitwise what one call per parameter gives (on the CPU each matrix is orthogonalised on
// its own either way), with per-parameter metrics and owned (scattered) matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/rng.h"
#include "optim/muon.h"

namespace {

using mt::core::DType;
using mt::core::Tensor;
using mt::optim::Muon;

// Three 6 x 10 weights (one without decay), a stack of 9 (alone: kAloneFrom is 8) and one of 2 (batched with the
// weights), a 10 x 6 weight (another shape) and an AdamW vector.
void declare(mt::nn::ParamTable& table) {
    using mt::nn::OptimGroup;
    table.add({.name = "w1", .shape = {6, 10}, .group = OptimGroup::muon});
    table.add({.name = "bias", .shape = {10}, .weight_decay = false});
    table.add({.name = "stack9", .shape = {9, 6, 10}, .group = OptimGroup::muon});
    table.add({.name = "w2", .shape = {6, 10}, .group = OptimGroup::muon});
    table.add({.name = "nodecay", .shape = {6, 10}, .weight_decay = false, .group = OptimGroup::muon});
    table.add({.name = "stack2", .shape = {2, 6, 10}, .group = OptimGroup::muon});
    table.add({.name = "tall", .shape = {10, 6}, .group = OptimGroup::muon});
}

void fill_grads(mt::nn::ParamTable& table, int64_t s) {
    for (int i = 0; i < table.size(); ++i)
        mt::core::rng_fill_normal(table.grad(i), 70 + static_cast<uint64_t>(s), static_cast<uint64_t>(i), 0.0, 1.0);
}

struct Outcome {
    std::vector<float> master;
    std::vector<double> update_sq, n_norm_sorted;
    size_t batches = 0;
};

Outcome run(const std::optional<std::vector<mt::optim::MuonMatrixRef>>& owned) {
    mt::nn::ParamTable table;
    declare(table);
    table.finalize(mt::nn::Precision{});
    table.initialize(5);
    const mt::ops::MuonHyper hyper{.lr = 0.02, .weight_decay = 0.1};
    Muon muon(table, hyper, {.owned = owned});
    Outcome r;
    r.batches = muon.batches().size();
    for (int s = 1; s <= 3; ++s) {
        fill_grads(table, s);
        Muon::StepStats stats;
        muon.step(0.02, 0.5, {}, &stats);
        r.update_sq = stats.update_sq;
        r.n_norm_sorted = stats.n_norm;
    }
    std::sort(r.n_norm_sorted.begin(), r.n_norm_sorted.end());
    const Tensor m = table.master_arena();
    r.master.assign(m.data<float>(), m.data<float>() + m.numel());
    return r;
}

// The same steps as one ops::muon_step per parameter (the owned matrices only).
Outcome per_parameter(const std::optional<std::vector<mt::optim::MuonMatrixRef>>& owned) {
    mt::nn::ParamTable table;
    declare(table);
    table.finalize(mt::nn::Precision{});
    table.initialize(5);
    mt::ops::MuonHyper h{.lr = 0.02, .weight_decay = 0.1};
    std::vector<Tensor> momentum;
    for (int i = 0; i < table.size(); ++i)
        momentum.push_back(table.spec(i).group == mt::nn::OptimGroup::muon
                               ? Tensor::zeros(mt::optim::muon_matrices(table.master(i)).shape(), DType::f32)
                               : Tensor());
    Outcome r;
    for (int s = 1; s <= 3; ++s) {
        fill_grads(table, s);
        r.update_sq.assign(static_cast<size_t>(table.size()), 0.0);
        r.n_norm_sorted.clear();
        for (int i = 0; i < table.size(); ++i) {
            if (table.spec(i).group != mt::nn::OptimGroup::muon) continue;
            h.weight_decay = table.spec(i).weight_decay ? 0.1 : 0.0;
            const Tensor p = mt::optim::muon_matrices(table.master(i)), g = mt::optim::muon_matrices(table.grad(i));
            for (int64_t k = 0; k < p.size(0); ++k) {
                bool held = !owned;
                for (const auto& ref : owned.value_or(std::vector<mt::optim::MuonMatrixRef>{}))
                    held = held || (ref.param == i && ref.index == k);
                if (!held) continue;
                const Tensor sq = Tensor::zeros({1}, DType::f64), n = Tensor::zeros({1}, DType::f64);
                mt::ops::muon_step(p.slice(0, k, k + 1),
                                   g.slice(0, k, k + 1),
                                   momentum[size_t(i)].slice(0, k, k + 1),
                                   h,
                                   0.5,
                                   sq,
                                   {},
                                   n);
                r.update_sq[size_t(i)] += sq.data<double>()[0];
                r.n_norm_sorted.push_back(n.data<double>()[0]);
            }
        }
    }
    std::sort(r.n_norm_sorted.begin(), r.n_norm_sorted.end());
    const Tensor m = table.master_arena();
    r.master.assign(m.data<float>(), m.data<float>() + m.numel());
    return r;
}

void expect_same(const Outcome& got, const Outcome& want) {
    ASSERT_EQ(got.master.size(), want.master.size());
    for (size_t i = 0; i < got.master.size(); ++i) ASSERT_EQ(got.master[i], want.master[i]) << "master element " << i;
    ASSERT_EQ(got.update_sq.size(), want.update_sq.size());
    for (size_t i = 0; i < got.update_sq.size(); ++i)
        EXPECT_NEAR(got.update_sq[i], want.update_sq[i], 1e-12 * want.update_sq[i]) << "update_sq of parameter " << i;
    ASSERT_EQ(got.n_norm_sorted.size(), want.n_norm_sorted.size());
    for (size_t i = 0; i < got.n_norm_sorted.size(); ++i) EXPECT_EQ(got.n_norm_sorted[i], want.n_norm_sorted[i]);
}

TEST(MuonBatches, SmallEntriesOfOneShapeRunTogetherBitwiseAsOneCallEach) {
    const Outcome got = run(std::nullopt);
    // {w1, w2, stack2}, {stack9}, {nodecay}, {tall}
    EXPECT_EQ(got.batches, 4u);
    expect_same(got, per_parameter(std::nullopt));
}

TEST(MuonBatches, OwnedScatteredMatricesToo) {
    const std::vector<mt::optim::MuonMatrixRef> owned{{.param = 0},
                                                      {.param = 2, .index = 1},
                                                      {.param = 2, .index = 4},
                                                      {.param = 2, .index = 5},
                                                      {.param = 5, .index = 1},
                                                      {.param = 6}};
    const Outcome got = run(owned);
    // {w1, stack9's three (fewer than kAloneFrom: batched by shape), stack2[1]}, {tall}
    EXPECT_EQ(got.batches, 2u);
    expect_same(got, per_parameter(owned));
}

}  // namespace

// muon.per_head: a projection of 3 heads of 4 rows is three 4 x 10 matrices, each with its own norm and its own scale
// 0.2 sqrt(10); bitwise what ops::muon_step on the [3, 4, 10] view gives, and not what the whole 12 x 10 matrix gives.
TEST(MuonBatches, PerHeadOrthogonalisesEachHeadsRows) {
    auto make = [](mt::nn::ParamTable& table) {
        table.add({.name = "wq", .shape = {12, 10}, .group = mt::nn::OptimGroup::muon, .head_rows = 4});
        table.finalize(mt::nn::Precision{});
        table.initialize(9);
        mt::core::rng_fill_normal(table.grad(0), 80, 0, 0.0, 1.0);
    };
    const mt::ops::MuonHyper hyper{.lr = 0.02, .weight_decay = 0.1};
    auto run_muon = [&](bool per_head) {
        mt::nn::ParamTable table;
        make(table);
        Muon muon(table, hyper, {.per_head = per_head});
        muon.step(0.02, 1.0);
        return table.master(0).clone();
    };
    mt::nn::ParamTable table;
    make(table);
    const Tensor heads = table.master(0).reshape({3, 4, 10});
    mt::ops::muon_step(heads, table.grad(0).reshape({3, 4, 10}), Tensor::zeros({3, 4, 10}, DType::f32), hyper, 1.0);
    const Tensor per_head = run_muon(true), whole = run_muon(false);
    double differ = 0.0;
    for (int64_t i = 0; i < per_head.numel(); ++i) {
        ASSERT_EQ(per_head.data<float>()[i], table.master(0).data<float>()[i]) << "element " << i;
        differ = std::max(differ, std::abs(double(per_head.data<float>()[i]) - double(whole.data<float>()[i])));
    }
    EXPECT_GT(differ, 1e-4);
}

// The overlap's phases (muon.md §3): staging every phase and committing equals one step bitwise (parameters and
// momentum, and the metrics), the batches never mixing phases; a discarded stage leaves the state untouched.
TEST(MuonBatches, StagedPhasesCommitAsOneStepAndDiscardLeavesTheState) {
    auto make = [](mt::nn::ParamTable& table) {
        declare(table);
        table.finalize(mt::nn::Precision{});
        table.initialize(5);
        fill_grads(table, 1);
    };
    const mt::ops::MuonHyper hyper{.lr = 0.02, .weight_decay = 0.1};
    const std::vector<int> phases = {0, -1, 1, 0, 1, 1, 0};  // w1, bias, stack9, w2, nodecay, stack2, tall
    auto state = [](const mt::nn::ParamTable& table, const Muon& muon) {
        std::vector<float> out(table.master_arena().data<float>(),
                               table.master_arena().data<float>() + table.master_arena().numel());
        for (const auto& e : muon.entries())
            out.insert(out.end(), e.momentum.data<float>(), e.momentum.data<float>() + e.momentum.numel());
        return out;
    };
    mt::nn::ParamTable one, phased;
    make(one);
    make(phased);
    Muon whole(one, hyper), staged(phased, hyper, {.phase_of_param = phases});
    // {w1, w2}, {tall} in phase 0; {stack9}, {nodecay}, {stack2} in phase 1
    EXPECT_EQ(staged.batches().size(), 5u);
    const std::vector<float> before = state(phased, staged);
    staged.stage(1, 0.02, 0.5, false);
    EXPECT_EQ(staged.staged_batches(), 3);
    staged.discard();
    EXPECT_EQ(state(phased, staged), before);
    Muon::StepStats a, b;
    whole.step(0.02, 0.5, {}, &a);
    staged.stage(1, 0.02, 0.5, true);
    staged.stage(0, 0.02, 0.5, true);
    EXPECT_EQ(state(phased, staged), before);  // nothing written before the commit
    staged.commit({}, &b);
    EXPECT_EQ(state(phased, staged), state(one, whole));
    EXPECT_EQ(a.update_sq, b.update_sq);
    std::sort(a.n_norm.begin(), a.n_norm.end());
    std::sort(b.n_norm.begin(), b.n_norm.end());
    EXPECT_EQ(a.n_norm, b.n_norm);
}
