// The loss is normalised by the supervised tokens of the whole global batch (long_context.md §5, §10 test 5): two
// micro-batches with 10 and 1000 supervised tokens give the loss and the gradients of one batch holding both, and
// not the mean of the two micro-batches' means (which weighs the 10 tokens a hundred times more). Through
// Trainer::train_step on the caller's batches, with chunked and unchunked LM heads.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/rng.h"
#include "nn/model.h"
#include "support/rho.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace {

using mt::core::DType;
using mt::core::Tensor;

constexpr int64_t kSeq = 1024;

struct Step {
    double loss;
    Tensor grads;
};

// Rows r = 0, 1 of the same tokens; row 0 supervises its first 10 targets, row 1 its first 1000. `micro`: the
// rows as two micro-batches of one row (grad_accum 2) or one batch of two rows (grad_accum 1).
Step step(const std::string& dir, bool micro, int64_t chunk) {
    const int64_t accum = micro ? 2 : 1, batch = micro ? 1 : 2;
    mt::train::JobConfig cfg = mt::testing::tiny_job(dir,
                                                     {"model.max_seq_len=1024",
                                                      "train.seq_len=1024",
                                                      fmt::format("train.batch_size={}", batch),
                                                      fmt::format("train.grad_accum={}", accum),
                                                      fmt::format("loss.chunk_tokens={}", chunk)});
    mt::train::Trainer trainer(cfg, false);
    Tensor inputs = Tensor::zeros({accum, batch, kSeq}, DType::i32), targets = inputs.clone();
    for (int64_t row = 0; row < 2; ++row)
        for (int64_t t = 0; t < kSeq; ++t) {
            const int64_t i = row * kSeq + t;  // row-major over [accum, batch, T] in both layouts
            mt::core::tensor_set_flat(inputs, i, static_cast<double>(mt::core::rng_u64(9, 0, i) % 61));
            const bool supervised = t < (row == 0 ? 10 : 1000);
            mt::core::tensor_set_flat(
                targets, i, supervised ? static_cast<double>(mt::core::rng_u64(9, 1, i) % 61) : mt::nn::kIgnoreIndex);
        }
    const mt::train::StepResult r = trainer.train_step(inputs, targets);
    return {r.loss, trainer.model().params().grad_arena().clone()};
}

TEST(LossNormalisation, MicroBatchesOf10And1000TokensEqualOneBatchHoldingBoth) {
    for (int64_t chunk : {0, 300}) {
        SCOPED_TRACE(::testing::Message() << "loss.chunk_tokens " << chunk);
        const std::string dir = mt::testing::fresh_dir(fmt::format("c{}", chunk));
        const Step one = step(dir, false, chunk), two = step(dir, true, chunk);
        ASSERT_GT(one.loss, 0.0);
        EXPECT_NEAR(two.loss, one.loss, 1e-6 * one.loss);
        EXPECT_LE(mt::testing::rho(two.grads, one.grads), 1e-6);
    }
}

}  // namespace
