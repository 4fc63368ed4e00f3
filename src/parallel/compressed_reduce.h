// A packed bucket's reduce-to-owner with gradient compression (muon.md §6, compress.level 1-3): compressed messages
// cannot be summed in flight, so the bucket's reduce-scatter becomes an all-to-all of per-owner messages and the owner
// sums what it receives. The message to owner r is its block's element-sharded part (AdamW's slice) as raw f32,
// followed by the block's matrices part compressed by this rank's codec for r (optim/grad_compress.h): compression
// applies to Muon's matrices only, as the spec puts AdamW's parameters in uncompressed buckets. The owner's sum keeps
// GradSync's convention (a plain sum of the ranks' pre-scaled gradients): levels 1 and 2 add the decoded messages;
// level 3 keeps the EF21 estimate h (the mean of the senders' h_w) and hands R h to the optimizer. Host tensors (f32)
// only: the codecs are CPU code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/grad_compress.h"
#include "parallel/comm.h"

namespace mt::parallel {

class CompressedReduce {
   public:
    // flat[r], owned[r]: group rank r's block as arena ranges (its element-sharded slice, then its matrices); rank:
    // this rank in the group; bucket: the bucket's index (level 1's random stream).
    CompressedReduce(const optim::CompressOptions& options,
                     std::vector<std::vector<optim::ArenaRange>> flat,
                     std::vector<std::vector<optim::ArenaRange>> owned,
                     int rank,
                     int64_t bucket);

    // Encodes this rank's gradients (the f32 host arena) for every owner and starts the all-to-all over comm.
    [[nodiscard]] CommWork start(Comm& comm, const core::Tensor& grads, int64_t step);
    // After start's work completed: this rank's block of the sum over the group, written into grads.
    void finish(const core::Tensor& grads);

    // Squared norms of the last encodes, summed over this rank's codecs (optim::CompressStats).
    optim::CompressStats stats() const;
    // Bytes this rank sent in the last exchange, and what the same exchange moves uncompressed (f32).
    int64_t wire_bytes() const {
        return wire_bytes_;
    }
    int64_t raw_bytes() const {
        return raw_bytes_;
    }

    // The error-feedback state for checkpoints (kind "ef", per rank): name suffix and the f32 buffer.
    struct State {
        std::string name;
        std::span<float> values;
    };
    std::vector<State> states();
    void reset_states();

   private:
    static int64_t elements(const std::vector<optim::ArenaRange>& ranges);
    int64_t message_bytes(size_t r) const;

    optim::CompressOptions options_;
    std::vector<std::vector<optim::ArenaRange>> flat_, owned_;
    int rank_ = 0;
    int64_t bucket_ = 0;
    std::vector<optim::GradCompressor> senders_;   // one per owner r: the codec of block r's matrices part
    std::optional<optim::Ef21Receiver> receiver_;  // level 3: the estimate h of this rank's matrices
    std::vector<uint8_t> send_, recv_;
    std::vector<int64_t> send_counts_, recv_counts_;
    int64_t wire_bytes_ = 0, raw_bytes_ = 0;
};

}  // namespace mt::parallel
