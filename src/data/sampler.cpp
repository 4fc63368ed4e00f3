// Stateless shuffled windows: a Philox-keyed Feistel permutation per epoch (cycle walking keeps it in range).
#include "data/sampler.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace mt::data {

using core::ExitCode;

namespace {
constexpr int kFeistelRounds = 6;
}

int64_t sampler_permute(int64_t index, int64_t n, uint64_t seed, uint64_t epoch) {
    MT_CHECK(n > 0 && index >= 0 && index < n, "permute index {} of {}", index, n);
    if (n == 1) return 0;
    int bits = static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1)));
    bits += bits & 1;
    const int half = bits / 2;
    const uint64_t mask = (uint64_t{1} << half) - 1;
    const uint64_t stream = core::hash_name("mt.data.sampler") + epoch;
    uint64_t x = static_cast<uint64_t>(index);
    do {
        uint64_t left = x >> half, right = x & mask;
        for (int r = 0; r < kFeistelRounds; ++r) {
            const uint64_t f = core::philox4x32(seed, stream, (static_cast<uint64_t>(r) << 32) | right)[0] & mask;
            const uint64_t next = left ^ f;
            left = right;
            right = next;
        }
        x = (left << half) | right;
    } while (x >= static_cast<uint64_t>(n));
    return static_cast<int64_t>(x);
}

int64_t sampler_first_sample(
    int64_t step, int64_t grad_accum, int64_t micro, int64_t world, int64_t rank, int64_t batch) {
    return ((step * grad_accum + micro) * world + rank) * batch;
}

Sampler::Sampler(const TokenSource& source, int64_t seq_len, uint64_t seed)
    : source_(source), seq_len_(seq_len), seed_(seed) {
    MT_CHECK(seq_len > 0, "seq_len must be positive, got {}", seq_len);
    n_windows_ = (source.num_tokens() - 1) / seq_len;
    if (n_windows_ <= 0)
        core::fail_hint(ExitCode::data,
                        "add data or lower the sequence length.",
                        "the token data holds {} tokens but one sample of seq_len {} needs {} ({}) [{}]",
                        source.num_tokens(),
                        seq_len,
                        seq_len + 1,
                        source.describe(),
                        source.file_list());
}

int64_t Sampler::window_of(int64_t sample) const {
    MT_CHECK(sample >= 0, "negative sample index {}", sample);
    const int64_t epoch = sample / n_windows_;
    return sampler_permute(sample % n_windows_, n_windows_, seed_, static_cast<uint64_t>(epoch));
}

void Sampler::check_outputs(int64_t batch, const core::Tensor& inputs, const core::Tensor& targets) const {
    for (const core::Tensor* t : {&inputs, &targets}) {
        MT_CHECK(t->device() == core::Device::cpu && t->dtype() == core::DType::i32 && t->is_contiguous(),
                 "sampler outputs must be contiguous CPU int32 tensors");
        MT_CHECK(t->ndim() == 2, "sampler outputs must be [batch, seq_len], got {}", core::shape_str(t->shape()));
        MT_CHECK_SHAPE(t->size(0), batch, "sampler output rows");
        MT_CHECK_SHAPE(t->size(1), seq_len_, "sampler output columns");
    }
}

void Sampler::fill_row(int64_t window, int32_t* inputs, int32_t* targets) const {
    thread_local std::vector<int32_t> buf;
    buf.resize(static_cast<size_t>(seq_len_) + 1);
    source_.read(window * seq_len_, seq_len_ + 1, buf.data());
    std::copy(buf.begin(), buf.end() - 1, inputs);
    std::copy(buf.begin() + 1, buf.end(), targets);
}

void Sampler::fill(int64_t first_sample, int64_t batch, const core::Tensor& inputs, const core::Tensor& targets) const {
    check_outputs(batch, inputs, targets);
    int32_t* in = inputs.data<int32_t>();
    int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < batch; ++r) fill_row(window_of(first_sample + r), in + r * seq_len_, tg + r * seq_len_);
}

void Sampler::fill_sequential(int64_t first_window,
                              int64_t batch,
                              const core::Tensor& inputs,
                              const core::Tensor& targets) const {
    MT_CHECK(first_window >= 0, "negative window index {}", first_window);
    check_outputs(batch, inputs, targets);
    int32_t* in = inputs.data<int32_t>();
    int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < batch; ++r) fill_row((first_window + r) % n_windows_, in + r * seq_len_, tg + r * seq_len_);
}

}  // namespace mt::data
