// The compressed reduce-to-owner of a packed bucket (parallel/compressed_reduce.h).
#include "parallel/compressed_reduce.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "core/error.h"

namespace mt::parallel {

int64_t CompressedReduce::elements(const std::vector<optim::ArenaRange>& ranges) {
    int64_t n = 0;
    for (const optim::ArenaRange& r : ranges) n += r.end - r.begin;
    return n;
}

CompressedReduce::CompressedReduce(const optim::CompressOptions& options,
                                   std::vector<std::vector<optim::ArenaRange>> flat,
                                   std::vector<std::vector<optim::ArenaRange>> owned,
                                   int rank,
                                   int64_t bucket)
    : options_(options), flat_(std::move(flat)), owned_(std::move(owned)), rank_(rank), bucket_(bucket) {
    MT_CHECK(flat_.size() == owned_.size() && rank_ >= 0 && rank_ < static_cast<int>(flat_.size()),
             "compressed reduce: rank {} of {} blocks",
             rank_,
             flat_.size());
    int64_t offset = 0;  // level 1 draws per element of the bucket's matrices part, block after block
    for (size_t r = 0; r < owned_.size(); ++r) {
        senders_.emplace_back(options_, elements(owned_[r]), offset);
        offset += elements(owned_[r]);
    }
    if (options_.level == optim::kCompressTopkEf21)
        receiver_.emplace(options_, elements(owned_[static_cast<size_t>(rank_)]));
    for (size_t r = 0; r < owned_.size(); ++r) {
        send_counts_.push_back(message_bytes(r));
        recv_counts_.push_back(message_bytes(static_cast<size_t>(rank_)));
    }
}

int64_t CompressedReduce::message_bytes(size_t r) const {
    return elements(flat_[r]) * 4 + senders_[r].message_bytes();
}

CommWork CompressedReduce::start(Comm& comm, const core::Tensor& grads, int64_t step) {
    MT_CHECK(grads.device() == core::Device::cpu && grads.dtype() == core::DType::f32,
             "gradient compression runs on f32 host gradients (the codecs are CPU code), got {} on {}",
             core::dtype_name(grads.dtype()),
             grads.device() == core::Device::cpu ? "the CPU" : "the GPU");
    MT_CHECK(comm.size() == static_cast<int>(flat_.size()),
             "compressed reduce over {} ranks for {} blocks",
             comm.size(),
             flat_.size());
    const float* g = grads.data<float>();
    int64_t total = 0, raw = 0;
    for (size_t r = 0; r < flat_.size(); ++r) total += send_counts_[r];
    send_.resize(static_cast<size_t>(total));
    recv_.resize(static_cast<size_t>(recv_counts_[static_cast<size_t>(rank_)] * comm.size()));
    std::vector<float> part;
    uint8_t* out = send_.data();
    for (size_t r = 0; r < flat_.size(); ++r) {
        for (const optim::ArenaRange& range : flat_[r]) {
            std::memcpy(out, g + range.begin, static_cast<size_t>(range.end - range.begin) * sizeof(float));
            out += (range.end - range.begin) * 4;
        }
        part.clear();
        for (const optim::ArenaRange& range : owned_[r]) part.insert(part.end(), g + range.begin, g + range.end);
        const int64_t bytes = senders_[r].message_bytes();
        senders_[r].encode(part, {.step = step, .bucket = bucket_, .rank = rank_}, {out, static_cast<size_t>(bytes)});
        out += bytes;
        raw += (elements(flat_[r]) + elements(owned_[r])) * 4;
    }
    wire_bytes_ = total;
    raw_bytes_ = raw;
    return comm.all_to_all_v(send_.data(), send_counts_, recv_.data(), recv_counts_, CommType::u8);
}

void CompressedReduce::finish(const core::Tensor& grads) {
    const auto me = static_cast<size_t>(rank_);
    const int64_t n_flat = elements(flat_[me]), n_owned = elements(owned_[me]);
    const int64_t msg = recv_counts_[me];
    const auto ranks = static_cast<int64_t>(flat_.size());
    // The element-sharded part: an f32 sum in rank order; the matrices part decoded (levels 1, 2) or EF21's R h.
    std::vector<float> flat_sum(static_cast<size_t>(n_flat), 0.0f), owned_sum(static_cast<size_t>(n_owned), 0.0f);
    std::vector<std::span<const uint8_t>> coded;
    for (int64_t w = 0; w < ranks; ++w) {
        const uint8_t* m = recv_.data() + w * msg;
        for (int64_t i = 0; i < n_flat; ++i) {
            float x = 0.0f;
            std::memcpy(&x, m + i * 4, sizeof(float));
            flat_sum[static_cast<size_t>(i)] += x;
        }
        coded.emplace_back(m + n_flat * 4, static_cast<size_t>(msg - n_flat * 4));
    }
    if (receiver_) {
        receiver_->update(coded);
        const std::span<const float> h = std::as_const(*receiver_).h();
        for (int64_t i = 0; i < n_owned; ++i)
            owned_sum[static_cast<size_t>(i)] = h[static_cast<size_t>(i)] * static_cast<float>(ranks);
    } else {
        for (const std::span<const uint8_t>& m : coded) optim::GradCompressor::decode_add(options_, m, owned_sum);
    }
    // Back to their places in the arena, range after range (std::copy returns the destination's end, so the source
    // position is advanced by hand).
    float* g = grads.data<float>();
    auto scatter = [g](const std::vector<float>& sums, const std::vector<optim::ArenaRange>& ranges) {
        const float* from = sums.data();
        for (const optim::ArenaRange& range : ranges) {
            std::copy(from, from + (range.end - range.begin), g + range.begin);
            from += range.end - range.begin;
        }
    };
    scatter(flat_sum, flat_[me]);
    scatter(owned_sum, owned_[me]);
}

optim::CompressStats CompressedReduce::stats() const {
    optim::CompressStats sum;
    for (const optim::GradCompressor& s : senders_) sum += s.last_stats();
    return sum;
}

std::vector<CompressedReduce::State> CompressedReduce::states() {
    std::vector<State> out;
    for (size_t r = 0; r < senders_.size(); ++r)
        if (!senders_[r].state().empty()) out.push_back({fmt::format("b{}.to{}", bucket_, r), senders_[r].state()});
    if (receiver_ && !receiver_->h().empty()) out.push_back({fmt::format("b{}.h", bucket_), receiver_->h()});
    return out;
}

void CompressedReduce::reset_states() {
    for (optim::GradCompressor& s : senders_) s.reset_state();
    if (receiver_) receiver_->reset_state();
}

}  // namespace mt::parallel
