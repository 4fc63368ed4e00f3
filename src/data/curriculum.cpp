// Curriculum rows: a keyed block permutation decides long or replay, Philox draws pick documents; no state.
#include "data/curriculum.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "data/sampler.h"

namespace mt::data {

using core::ExitCode;

namespace {

// The block permutations use sampler_permute's Feistel network with "epochs" far above any real epoch, so they never
// repeat the data sampler's (its epoch counts passes over the data).
constexpr uint64_t kBlockEpochBase = uint64_t{1} << 48;

}  // namespace

CurriculumSampler::CurriculumSampler(const TokenSource& source,
                                     const DocIndex& index,
                                     int64_t stage,
                                     int64_t seq_len,
                                     double long_fraction,
                                     uint64_t seed)
    : source_(source), index_(index), stage_(stage), seq_len_(seq_len), long_fraction_(long_fraction), seed_(seed) {
    MT_CHECK(seq_len > 0 && stage >= 0 && long_fraction <= 1.0,
             "curriculum stage {}: seq_len {}, long_fraction {}",
             stage,
             seq_len,
             long_fraction);
    natural_ = long_fraction < 0.0;
    long_per_block_ = natural_ ? 0 : std::llround(long_fraction * static_cast<double>(kCurriculumBlock));
    const int64_t long_min = (seq_len + 1) / 2;
    long_prefix_.push_back(0);
    for (int64_t d = 0; d < index.size(); ++d) {
        const int64_t len = index.lengths[static_cast<size_t>(d)];
        if (index.tagged[static_cast<size_t>(d)] || len >= long_min) {
            long_docs_.push_back(d);
            long_prefix_.push_back(long_prefix_.back() + len);
        } else {
            short_docs_.push_back(d);
        }
    }
    if (natural_) {
        windows_ = std::make_unique<Sampler>(source, seq_len, seed);
        return;
    }
    if (long_per_block_ > 0 && long_docs_.empty())
        core::fail_hint(ExitCode::data,
                        "add long documents (`moetrain data --long-doc DIR`, docs/long_context.md) or lower "
                        "long_fraction",
                        "curriculum stage {} (seq_len {}) wants long_fraction {} but the training data has no long "
                        "document (none of at least {} tokens, none tagged long) [{}]",
                        stage,
                        seq_len,
                        long_fraction,
                        long_min,
                        source.file_list());
    if (long_per_block_ < kCurriculumBlock && short_docs_.empty())
        core::fail_hint(ExitCode::data,
                        "add short documents to the data or set long_fraction = 1",
                        "curriculum stage {} (seq_len {}) replays the short mix but every document of the training "
                        "data is long (at least {} tokens or tagged long) [{}]",
                        stage,
                        seq_len,
                        long_min,
                        source.file_list());
}

uint64_t CurriculumSampler::draw(int64_t sample, int64_t k) const {
    // Counter: the sample in the high bits, the draw within its row in the low 20 (a row takes at most seq_len + 1
    // draws, one per document it holds).
    const uint64_t stream = core::hash_name("mt.data.curriculum") + static_cast<uint64_t>(stage_);
    return core::rng_u64(seed_, stream, (static_cast<uint64_t>(sample) << 20) + static_cast<uint64_t>(k));
}

bool CurriculumSampler::is_long(int64_t sample) const {
    MT_CHECK(sample >= 0, "negative sample index {}", sample);
    if (long_per_block_ == 0) return false;
    if (long_per_block_ == kCurriculumBlock) return true;
    const uint64_t block = static_cast<uint64_t>(sample / kCurriculumBlock);
    const uint64_t epoch = kBlockEpochBase + (static_cast<uint64_t>(stage_) << 32) + block;
    return sampler_permute(sample % kCurriculumBlock, kCurriculumBlock, seed_, epoch) < long_per_block_;
}

int64_t CurriculumSampler::count_long(int64_t n) const {
    const int64_t whole = n / kCurriculumBlock;
    int64_t count = whole * long_per_block_;
    for (int64_t i = whole * kCurriculumBlock; i < n; ++i) count += is_long(i);
    return count;
}

bool CurriculumSampler::doc_is_long(int64_t doc) const {
    return index_.tagged[static_cast<size_t>(doc)] || index_.lengths[static_cast<size_t>(doc)] >= (seq_len_ + 1) / 2;
}

int64_t CurriculumSampler::long_tokens(int64_t begin, int64_t end) const {
    if (!natural_) return (count_long(end) - count_long(begin)) * seq_len_;
    int64_t tokens = 0;
    for (int64_t i = begin; i < end; ++i) {
        const int64_t lo = windows_->window_of(i) * seq_len_, hi = lo + seq_len_;
        // The document holding token lo, then each following one that starts before hi.
        auto d = static_cast<int64_t>(std::upper_bound(index_.starts.begin(), index_.starts.end(), lo) -
                                      index_.starts.begin()) -
                 1;
        for (; d < index_.size() && index_.starts[static_cast<size_t>(d)] < hi; ++d) {
            if (!doc_is_long(d)) continue;
            const int64_t s = index_.starts[static_cast<size_t>(d)], e = s + index_.lengths[static_cast<size_t>(d)];
            tokens += std::min(e, hi) - std::max(s, lo);
        }
    }
    return tokens;
}

void CurriculumSampler::fill_row(int64_t sample, int32_t* tokens, uint8_t* from_long) const {
    const int64_t need = seq_len_ + 1;
    if (natural_) {
        const int64_t lo = windows_->window_of(sample) * seq_len_;
        source_.read(lo, need, tokens);
        if (from_long != nullptr)
            for (int64_t i = 0; i < need; ++i) {
                const auto d =
                    static_cast<int64_t>(std::upper_bound(index_.starts.begin(), index_.starts.end(), lo + i) -
                                         index_.starts.begin()) -
                    1;
                from_long[i] = doc_is_long(d) ? 1 : 0;
            }
        return;
    }
    const bool long_row = is_long(sample);
    int64_t filled = 0;
    for (int64_t k = 0; filled < need; ++k) {
        MT_CHECK(k < (int64_t{1} << 20), "curriculum row {} needs over 2^20 documents", sample);
        const uint64_t r = draw(sample, k);
        int64_t doc, offset = 0;
        if (long_row) {
            const int64_t total = long_prefix_.back();
            const int64_t p = static_cast<int64_t>(r % static_cast<uint64_t>(total));
            const size_t i = static_cast<size_t>(std::upper_bound(long_prefix_.begin(), long_prefix_.end(), p) -
                                                 long_prefix_.begin()) -
                             1;
            doc = long_docs_[i];
            // The first document of the row starts at the drawn token, moved back so that it fills the row when it
            // is long enough; later ones start at their beginning.
            if (k == 0)
                offset = std::max<int64_t>(
                    0, std::min(p - long_prefix_[i], index_.lengths[static_cast<size_t>(doc)] - need));
        } else {
            doc = short_docs_[static_cast<size_t>(r % static_cast<uint64_t>(short_docs_.size()))];
        }
        const int64_t n = std::min(index_.lengths[static_cast<size_t>(doc)] - offset, need - filled);
        source_.read(index_.starts[static_cast<size_t>(doc)] + offset, n, tokens + filled);
        if (from_long != nullptr) std::fill(from_long + filled, from_long + filled + n, long_row ? 1 : 0);
        filled += n;
    }
}

void CurriculumSampler::fill(int64_t first_sample,
                             int64_t batch,
                             const core::Tensor& inputs,
                             const core::Tensor& targets) const {
    for (const core::Tensor* t : {&inputs, &targets}) {
        MT_CHECK(
            t->device() == core::Device::cpu && t->dtype() == core::DType::i32 && t->is_contiguous() && t->ndim() == 2,
            "curriculum outputs must be contiguous CPU int32 [batch, seq_len] tensors");
        MT_CHECK_SHAPE(t->size(0), batch, "curriculum output rows");
        MT_CHECK_SHAPE(t->size(1), seq_len_, "curriculum output columns");
    }
    if (natural_) {
        windows_->fill(first_sample, batch, inputs, targets);
        return;
    }
    std::vector<int32_t> row(static_cast<size_t>(seq_len_) + 1);
    int32_t* in = inputs.data<int32_t>();
    int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < batch; ++r) {
        fill_row(first_sample + r, row.data(), nullptr);
        std::copy(row.begin(), row.end() - 1, in + r * seq_len_);
        std::copy(row.begin() + 1, row.end(), tg + r * seq_len_);
    }
}

std::vector<int64_t> curriculum_first_steps(const std::vector<int64_t>& seq_lens,
                                            const std::vector<int64_t>& tokens,
                                            int64_t rows_per_step) {
    MT_CHECK(seq_lens.size() == tokens.size() && rows_per_step > 0, "curriculum schedule inputs");
    std::vector<int64_t> first;
    int64_t step = 0;
    for (size_t s = 0; s < seq_lens.size(); ++s) {
        first.push_back(step);
        const int64_t per_step = rows_per_step * seq_lens[s];
        step += (tokens[s] + per_step - 1) / per_step;
    }
    return first;
}

int64_t curriculum_stage_of_step(const std::vector<int64_t>& first_steps, int64_t step) {
    MT_CHECK(!first_steps.empty() && step >= 0, "curriculum stage of step {}", step);
    return static_cast<int64_t>(std::upper_bound(first_steps.begin(), first_steps.end(), step) - first_steps.begin()) -
           1;
}

}  // namespace mt::data
