// The context-length curriculum's data (long_context.md §6): per stage, rows of seq_len tokens that are either drawn
// from long documents or replay of the short mix, packed whole documents separated by their EOT. Stateless, as the
// Sampler: sample i of stage s is a pure function of (seed, s, i), so resuming mid-stage needs only the position.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "data/doc_index.h"
#include "data/sampler.h"
#include "data/token_source.h"

namespace mt::data {

// Which rows are long: samples are grouped in blocks of kCurriculumBlock; in each block exactly
// round(long_fraction * kCurriculumBlock) of them, chosen by a keyed permutation of the block, are long. So the share
// of long rows is the target to within 1 / (2 kCurriculumBlock) over every whole block, and the rows of a step are
// still a random mix.
constexpr int64_t kCurriculumBlock = 1024;

// One stage's rows. A document is long when it has at least ceil(seq_len / 2) tokens or its source is tagged long
// (DocIndex::tagged); the rest are the short mix.
//   long row:   a position drawn uniformly over the tokens of the long documents; the row starts there (moved back
//               so the document fills the row when it can) and, if the document ends first, goes on with the next
//               drawn long document from its start;
//   replay row: short documents drawn uniformly, each from its start, packed until the row is full (the last one cut).
// A row holds seq_len + 1 tokens: inputs are [0, seq_len), targets [1, seq_len].
// A stage without a long_fraction (negative) is the natural mix: sample i is the Sampler's sample i at seq_len, a
// shuffled window of the whole stream, with whatever long documents it happens to hold.
class CurriculumSampler {
   public:
    // The source and index must outlive the sampler. Exit 3 when the stage needs long documents (long_fraction > 0)
    // and there are none, or replay (long_fraction < 1) and every document is long.
    CurriculumSampler(const TokenSource& source,
                      const DocIndex& index,
                      int64_t stage,
                      int64_t seq_len,
                      double long_fraction,
                      uint64_t seed);

    int64_t seq_len() const {
        return seq_len_;
    }
    int64_t num_long_documents() const {
        return static_cast<int64_t>(long_docs_.size());
    }
    int64_t num_short_documents() const {
        return static_cast<int64_t>(short_docs_.size());
    }
    bool natural() const {
        return natural_;
    }
    // Whether sample `sample` of the stage is a long row (false in a natural-mix stage).
    bool is_long(int64_t sample) const;
    // Long rows among samples [0, n) of the stage (a whole block at a time, so it is cheap for any n).
    int64_t count_long(int64_t n) const;
    // Input tokens (of seq_len) of samples [begin, end) that come from long documents: seq_len per long row, or in a
    // natural-mix stage the overlap of each window with the long documents. No tokens are read.
    int64_t long_tokens(int64_t begin, int64_t end) const;
    // Fills rows r = 0..batch-1 with sample first_sample + r of the stage.
    // @param[in]  first_sample  the stage's sample index of row 0
    // @param[in]  batch         rows
    // @param[out] inputs        [batch, seq_len] i32, CPU, contiguous
    // @param[out] targets       [batch, seq_len] i32, CPU, contiguous
    void fill(int64_t first_sample, int64_t batch, const core::Tensor& inputs, const core::Tensor& targets) const;
    // One row's seq_len + 1 tokens, and per token whether it comes from a long document (for tests and metrics).
    void fill_row(int64_t sample, int32_t* tokens, uint8_t* from_long) const;

   private:
    uint64_t draw(int64_t sample, int64_t k) const;
    bool doc_is_long(int64_t doc) const;

    const TokenSource& source_;
    const DocIndex& index_;
    int64_t stage_, seq_len_;
    double long_fraction_;
    uint64_t seed_;
    bool natural_;
    std::unique_ptr<Sampler> windows_;  // the natural mix's
    int64_t long_per_block_;
    std::vector<int64_t> long_docs_, short_docs_;  // document numbers
    std::vector<int64_t> long_prefix_;             // tokens of long_docs_[0..i), size long_docs_ + 1
};

// Where each stage starts: stage s covers steps [first[s], first[s + 1]), ceil(tokens_s / (rows_per_step seq_len_s))
// steps, so a stage switches at the first step boundary at or after its token budget; the last stage runs on.
// @param[in] seq_lens       per stage
// @param[in] tokens         per stage
// @param[in] rows_per_step  rows of the global batch (batch_size x grad_accum x data ranks)
std::vector<int64_t> curriculum_first_steps(const std::vector<int64_t>& seq_lens,
                                            const std::vector<int64_t>& tokens,
                                            int64_t rows_per_step);
// The stage of optimizer step `step` (0-based), given curriculum_first_steps.
int64_t curriculum_stage_of_step(const std::vector<int64_t>& first_steps, int64_t step);

}  // namespace mt::data
