// Cases and argument checks of the fused softmax + cross-entropy (ops/cross_entropy.h): ignored rows, the in-place
// backward (dlogits aliasing logits), out-of-range targets (exit 3), and the vocabulary-sharded form (vocab-parallel
// loss: the shards' partial results combine to the whole vocabulary's).
#include "ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

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

// Per-row loss weights (the model's loss weighting, nn::Model::set_row_loss_weights; multimodal.md §5): the output is
// w_i x loss_i and the backward passes w_i x dout_i as the op's per-row dlosses, as the model's head does. The weights
// are fixed per row (one row 0, the others 0.25, 0.5, 1 or 2), so the finite differences and the CPU-vs-CUDA parity
// check each row's dlogits scaled by its weight. Powers of two keep w x dout exact in bf16, as the harness keeps dout:
// with weights like 1.25 the target's gradient, about -w dout, rounds in bf16 by up to 2^-9 of itself, which at a
// vocabulary of 50257 (reference rms about |w dout| / sqrt(V)) is 1.4x the rms, past the max-abs budget (0.2) though
// the kernel is exact (rho 1.3e-3).
OpCase cross_entropy_row_weights_case(int64_t n, int64_t v) {
    const std::string name = fmt::format("cross_entropy_n{}_v{}_row_weights", n, v);
    std::vector<double> w;
    for (int64_t i = 0; i < n; ++i) w.push_back(i == 2 ? 0.0 : std::ldexp(1.0, static_cast<int>(i % 4) - 2));
    // x [n] (any device) scaled row by row by w, on the host, back on x's device in x's dtype.
    auto scaled = [w, n](const Tensor& x) {
        const Tensor host = x.device() == core::Device::cpu ? x.clone() : x.to_device(core::Device::cpu);
        for (int64_t i = 0; i < n; ++i)
            core::tensor_set_flat(host, i, core::tensor_get_flat(host, i) * w[static_cast<size_t>(i)]);
        Tensor out = op_like(x);
        out.copy_from(host);
        return out;
    };
    return {"cross_entropy", name, [=] {
                const uint64_t s = op_seed(name);
                Tensor targets = op_rand_ids({n}, s, 1, 0, static_cast<int32_t>(v));
                for (int64_t i = 1; i < n; i += 5) targets.data<int32_t>()[i] = -100;
                OpProblem p;
                p.inputs = {{"logits", op_randn({n, v}, s, 0, 0.0, 2.0), GradKind::written},
                            {"targets", targets, GradKind::none}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    Tensor losses = op_stat_like(in[0], {n}), lse = op_stat_like(in[0], {n});
                    cross_entropy_fwd(in[0], in[1], -100, losses, lse);
                    return std::vector<Tensor>{scaled(losses)};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    Tensor losses = op_stat_like(in[0], {n}), lse = op_stat_like(in[0], {n});
                    cross_entropy_fwd(in[0], in[1], -100, losses, lse);
                    grads[0].copy_from(in[0]);  // in place, as the model's head runs it
                    cross_entropy_bwd(grads[0], in[1], lse, -100, scaled(dout[0]), grads[0]);
                };
                return p;
            }};
}

// The vocabulary [0, sum of widths) split into shards of those widths, in order.
std::vector<VocabShard> split_vocab(const std::vector<int64_t>& widths) {
    int64_t total = 0;
    for (const int64_t w : widths) total += w;
    std::vector<VocabShard> shards;
    int64_t first = 0;
    for (const int64_t w : widths) {
        shards.push_back({first, total});
        first += w;
    }
    return shards;
}

// A contiguous copy of the columns [first, first + width) of logits [N, V] (any device).
Tensor shard_columns(const Tensor& logits, int64_t first, int64_t width) {
    Tensor local = op_like(logits, {logits.size(0), width});
    local.copy_from(logits.slice(1, first, first + width));
    return local;
}

Tensor on_host(const Tensor& t) {
    return t.device() == core::Device::cpu ? t : t.to_device(core::Device::cpu);
}

struct Combined {
    Tensor losses, lse;  // [N] each, the stat dtype of the logits, on their device
};

// The sharded forward over every shard of logits [N, V], combined as a tensor-parallel caller does (an all-reduce,
// here on the host in f64): lse = log sum_r exp(lse_r), loss = lse - sum_r losses_r, 0 for ignored rows.
Combined sharded_fwd(const Tensor& logits,
                     const Tensor& targets,
                     int32_t ignore_index,
                     const std::vector<VocabShard>& shards,
                     const std::vector<int64_t>& widths) {
    const int64_t n = logits.size(0);
    std::vector<Tensor> lse_r, losses_r;
    for (size_t r = 0; r < shards.size(); ++r) {
        const Tensor local = shard_columns(logits, shards[r].first, widths[r]);
        const Tensor losses = op_stat_like(logits, {n}), lse = op_stat_like(logits, {n});
        cross_entropy_fwd(local, targets, ignore_index, losses, lse, shards[r]);
        lse_r.push_back(on_host(lse));
        losses_r.push_back(on_host(losses));
    }
    const Tensor t = on_host(targets);
    const Tensor losses = Tensor::zeros({n}, DType::f64), lse = op_like(losses);
    for (int64_t i = 0; i < n; ++i) {
        double m = -std::numeric_limits<double>::infinity(), sum = 0.0, target_logit = 0.0;
        for (const Tensor& l : lse_r) m = std::max(m, core::tensor_get_flat(l, i));
        for (const Tensor& l : lse_r) sum += std::exp(core::tensor_get_flat(l, i) - m);
        for (const Tensor& l : losses_r) target_logit += core::tensor_get_flat(l, i);
        const double whole = m + std::log(sum);
        core::tensor_set_flat(lse, i, whole);
        core::tensor_set_flat(losses, i, t.data<int32_t>()[i] == ignore_index ? 0.0 : whole - target_logit);
    }
    Combined c{op_stat_like(logits, {n}), op_stat_like(logits, {n})};
    c.losses.copy_from(losses);
    c.lse.copy_from(lse);
    return c;
}

// The sharded backward of every shard, given the combined lse, written into the shard's columns of dlogits [N, V]
// (each shard's backward runs in place on its own copy of the logits when in_place).
void sharded_bwd(const Tensor& logits,
                 const Tensor& targets,
                 const Tensor& lse,
                 int32_t ignore_index,
                 const Tensor& dlosses,
                 const Tensor& dlogits,
                 const std::vector<VocabShard>& shards,
                 const std::vector<int64_t>& widths,
                 bool in_place) {
    // The shards' columns gather on the host: a device tensor takes only contiguous copies.
    const Tensor whole = Tensor::zeros(dlogits.shape(), dlogits.dtype());
    for (size_t r = 0; r < shards.size(); ++r) {
        const Tensor local = shard_columns(logits, shards[r].first, widths[r]);
        const Tensor d = in_place ? local : op_like(local);
        cross_entropy_bwd(local, targets, lse, ignore_index, dlosses, d, shards[r]);
        whole.slice(1, shards[r].first, shards[r].first + widths[r]).copy_from(on_host(d));
    }
    dlogits.copy_from(whole);
}

// The vocabulary split into shards of `widths` columns: the case's input is the whole [N, V] logits, its output the
// combined loss, so the finite differences check each shard's backward against the loss the shards compute
// together. Targets fall in every shard; every third row is ignored.
OpCase cross_entropy_shard_case(int64_t n, std::vector<int64_t> widths, int32_t ignore_index, bool in_place) {
    std::string split;
    for (const int64_t w : widths) split += fmt::format("{}{}", split.empty() ? "" : "x", w);
    const std::string name = fmt::format("cross_entropy_n{}_shards{}_ignore{}{}",
                                         n,
                                         split,
                                         ignore_index < 0 ? "neg" : std::to_string(ignore_index),
                                         in_place ? "_inplace" : "");
    const std::vector<VocabShard> shards = split_vocab(widths);
    const int64_t v = shards.front().total;
    return {"cross_entropy", name, [=] {
                const uint64_t s = op_seed(name);
                Tensor targets = op_rand_ids({n}, s, 1, 0, static_cast<int32_t>(v));
                for (int64_t i = 1; i < n; i += 3) targets.data<int32_t>()[i] = ignore_index;
                OpProblem p;
                p.inputs = {{"logits", op_randn({n, v}, s, 0, 0.0, 2.0), GradKind::written},
                            {"targets", targets, GradKind::none}};
                p.forward = [=](const std::vector<Tensor>& in) {
                    return std::vector<Tensor>{sharded_fwd(in[0], in[1], ignore_index, shards, widths).losses};
                };
                p.backward = [=](const std::vector<Tensor>& in,
                                 const std::vector<Tensor>& dout,
                                 const std::vector<Tensor>& grads) {
                    const Combined c = sharded_fwd(in[0], in[1], ignore_index, shards, widths);
                    sharded_bwd(in[0], in[1], c.lse, ignore_index, dout[0], grads[0], shards, widths, in_place);
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
    op_register(cross_entropy_row_weights_case(13, 257));
    op_register(op_parity_only(cross_entropy_row_weights_case(37, 50257)));  // CUDA: the 8-wide vector path
    // CUDA sizes: vocabularies of 32768 and more (one block per row, the 8-wide vector path), an odd vocabulary.
    op_register(op_parity_only(cross_entropy_case(64, 32768, -100, true)));
    op_register(op_parity_only(cross_entropy_case(37, 50257, -100, false)));
    op_register(op_parity_only(cross_entropy_case(16, 131072, -100, true)));
    // Vocabulary shards (uneven, of one column too), ignore_index a class id of the second shard.
    op_register(cross_entropy_shard_case(7, {4, 4, 3}, -100, false));
    op_register(cross_entropy_shard_case(13, {100, 157}, -100, true));
    op_register(cross_entropy_shard_case(11, {1, 2, 2}, 1, true));
    op_register(cross_entropy_shard_case(300, {128, 129}, -100, false));  // large enough to run on the OpenMP team
    op_register(op_parity_only(cross_entropy_shard_case(64, {16384, 16384}, -100, true)));
    op_register(op_parity_only(cross_entropy_shard_case(37, {25128, 25129}, -100, false)));
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

// Relative difference |a - b| / max(|a|, |b|), 0 where both are 0.
double rel_diff(double a, double b) {
    const double scale = std::max(std::fabs(a), std::fabs(b));
    return scale == 0.0 ? 0.0 : std::fabs(a - b) / scale;
}

// The vocabulary of 11 ids split into 6 + 5 and 4 + 4 + 3 columns (f64), with ignored rows: the shards' lse and
// losses, combined, are the whole vocabulary's, and their backward (given the combined lse), side by side, is the
// whole gradient, each element within 1e-12 relative.
TEST(OpCrossEntropy, ShardsCombineToTheWholeVocabulary) {
    const int64_t n = 12, v = 11;
    const int32_t ignore = -100;
    const Tensor logits = op_randn({n, v}, 11, 0, 0.0, 2.0), dlosses = op_randn({n}, 11, 1);
    Tensor targets = Tensor::zeros({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = static_cast<int32_t>(i % v);
    targets.data<int32_t>()[3] = ignore;
    targets.data<int32_t>()[8] = ignore;
    const Tensor losses = Tensor::zeros({n}, DType::f64), lse = op_like(losses), dlogits = op_like(logits);
    cross_entropy_fwd(logits, targets, ignore, losses, lse);
    cross_entropy_bwd(logits, targets, lse, ignore, dlosses, dlogits);
    for (const std::vector<int64_t>& widths : {std::vector<int64_t>{6, 5}, std::vector<int64_t>{4, 4, 3}}) {
        const std::vector<VocabShard> shards = split_vocab(widths);
        const Combined c = sharded_fwd(logits, targets, ignore, shards, widths);
        for (int64_t i = 0; i < n; ++i) {
            EXPECT_LE(rel_diff(c.lse.at({i}), lse.at({i})), 1e-12) << widths.size() << " shards, row " << i;
            EXPECT_LE(rel_diff(c.losses.at({i}), losses.at({i})), 1e-12) << widths.size() << " shards, row " << i;
        }
        for (const bool in_place : {false, true}) {
            const Tensor d = op_like(logits);
            d.fill(std::numeric_limits<double>::quiet_NaN());
            sharded_bwd(logits, targets, c.lse, ignore, dlosses, d, shards, widths, in_place);
            for (int64_t i = 0; i < n * v; ++i)
                EXPECT_LE(rel_diff(core::tensor_get_flat(d, i), core::tensor_get_flat(dlogits, i)), 1e-12)
                    << widths.size() << " shards, element " << i << (in_place ? ", in place" : "");
        }
    }
    // One shard's partial results as the header states them: its own lse, the target's logit or 0.
    const Tensor local = shard_columns(logits, 4, 4), part = op_like(losses), part_lse = op_like(losses);
    cross_entropy_fwd(local, targets, ignore, part, part_lse, VocabShard{4, v});
    for (int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 4; ++j) sum += std::exp(local.at({i, j}));
        EXPECT_NEAR(part_lse.at({i}), std::log(sum), 1e-14);
        const int32_t t = targets.data<int32_t>()[i];
        EXPECT_EQ(part.at({i}), t >= 4 && t < 8 ? logits.at({i, t}) : 0.0) << "row " << i;
    }
}

// Sharded, the targets are global: one outside the whole vocabulary (and not ignore_index) is bad label data (exit
// 3), one outside the shard but inside the vocabulary is not. A shard that does not fit is the caller's bug (exit 1).
TEST(OpCrossEntropy, ShardedTargetOutOfRangeIsDataError) {
    const VocabShard shard{4, 11};
    const Tensor logits = Tensor::zeros({4, 5}, DType::f32), losses = Tensor::zeros({4}, DType::f32);
    const Tensor lse = op_like(losses);
    Tensor targets = Tensor::zeros({4}, DType::i32);
    targets.data<int32_t>()[1] = -100;
    targets.data<int32_t>()[2] = 10;
    cross_entropy_fwd(logits, targets, -100, losses, lse, shard);
    cross_entropy_bwd(logits, targets, lse, -100, losses, op_like(logits), shard);
    targets.data<int32_t>()[3] = 11;
    expect_op_error([&] { cross_entropy_fwd(logits, targets, -100, losses, lse, shard); },
                    "cross_entropy_fwd: targets[3] = 11 is outside [0, 11) and is not ignore_index (-100)",
                    core::ExitCode::data);
    expect_op_error([&] { cross_entropy_bwd(logits, targets, lse, -100, losses, op_like(logits), shard); },
                    "cross_entropy_bwd: targets[3] = 11",
                    core::ExitCode::data);
    targets.data<int32_t>()[3] = 0;
    expect_op_error(
        [&] {
            cross_entropy_fwd(logits, targets, -100, losses, lse, VocabShard{7, 11});
        },
        "cross_entropy_fwd: the vocabulary shard [7, 12) is not inside a vocabulary of 11 ids");
    expect_op_error(
        [&] {
            cross_entropy_bwd(logits, targets, lse, -100, losses, logits, VocabShard{3, 0});
        },
        "cross_entropy_bwd: vocabulary shard first = 3, total = 0");
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
    // Sharded: checked against the whole vocabulary of 9 ids (targets[3] = 5 lies in it, targets[0] = 9 does not).
    targets.data<int32_t>()[0] = 9;
    const Tensor targets_big = targets.to_device(gpu);
    expect_op_error(
        [&] {
            cross_entropy_fwd(logits, targets_big, -100, losses, lse, VocabShard{4, 9});
        },
        "cross_entropy_fwd: targets[0] = 9 is outside [0, 9) and is not ignore_index (-100)",
        core::ExitCode::data);
    expect_op_error(
        [&] {
            cross_entropy_bwd(logits, targets_big, lse, -100, losses, op_like(logits), VocabShard{4, 9});
        },
        "cross_entropy_bwd: targets[0] = 9",
        core::ExitCode::data);
}

[[maybe_unused]] const bool kRegisteredCuda = [] {
    op_register_parity_check("cross_entropy", "cross_entropy_cuda_errors", cuda_errors);
    return true;
}();

}  // namespace
}  // namespace mt::ops::test
