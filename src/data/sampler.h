// Sampler: turns a TokenSource into (inputs, targets) rows. Stateless: sample g is a pure function of (seed, g),
// so resuming needs only the number of samples consumed.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "data/token_source.h"

namespace mt::data {

// The stream is cut into windows of seq_len + 1 tokens at stride seq_len (window w covers tokens
// [w * seq_len, w * seq_len + seq_len]); n_windows = (num_tokens - 1) / seq_len. Global sample g belongs to epoch
// e = g / n_windows and reads window perm_e(g % n_windows), where perm_e is a bijection of [0, n_windows) drawn
// from Philox keyed by (seed, stream = hash("mt.data.sampler") + e): a 6-round Feistel network on the next even
// power of two with cycle walking. No state is cached, so results never depend on call order or threads.
//
// How the trainer indexes samples: on data-parallel rank `rank` of `world`, micro-batch `micro` of
// `grad_accum` at optimizer step `step` reads the `batch` samples starting at
//     first_sample = ((step * grad_accum + micro) * world + rank) * batch        (sampler_first_sample)
// and a checkpoint saves samples consumed = (step + 1) * grad_accum * world * batch after step `step`, which is
// the first_sample of the next step (its micro 0, rank 0). Every sample is used once per epoch across all ranks.
class Sampler {
   public:
    // The source must outlive the sampler. Throws Error(ExitCode::data) when the source has fewer than
    // seq_len + 1 tokens.
    Sampler(const TokenSource& source, int64_t seq_len, uint64_t seed);

    int64_t seq_len() const {
        return seq_len_;
    }
    uint64_t seed() const {
        return seed_;
    }
    int64_t num_windows() const {
        return n_windows_;
    }
    int64_t epoch_of(int64_t sample) const {
        return sample / n_windows_;
    }
    // The window that global sample `sample` reads (shuffled per epoch).
    int64_t window_of(int64_t sample) const;

    // Fills rows r = 0..batch-1 with sample first_sample + r: inputs = window tokens [0, seq_len), targets =
    // tokens [1, seq_len]. Both tensors are CPU, contiguous, int32, shape [batch, seq_len].
    // @param[in]  first_sample  global index of row 0
    // @param[in]  batch         rows
    // @param[out] inputs        [batch, seq_len] i32
    // @param[out] targets       [batch, seq_len] i32
    void fill(int64_t first_sample, int64_t batch, const core::Tensor& inputs, const core::Tensor& targets) const;
    // Same, unshuffled, for validation: row r reads window (first_window + r) % num_windows().
    void fill_sequential(int64_t first_window,
                         int64_t batch,
                         const core::Tensor& inputs,
                         const core::Tensor& targets) const;

   private:
    void fill_row(int64_t window, int32_t* inputs, int32_t* targets) const;
    void check_outputs(int64_t batch, const core::Tensor& inputs, const core::Tensor& targets) const;

    const TokenSource& source_;
    int64_t seq_len_;
    uint64_t seed_;
    int64_t n_windows_;
};

// First global sample index of a micro-batch (see the Sampler comment).
int64_t sampler_first_sample(
    int64_t step, int64_t grad_accum, int64_t micro, int64_t world, int64_t rank, int64_t batch);

// The bijection of [0, n) used for one epoch; exposed for tests.
int64_t sampler_permute(int64_t index, int64_t n, uint64_t seed, uint64_t epoch);

}  // namespace mt::data
