// Gradient compression for the send-to-owner leg of distributed Muon (muon.md §6): the three codecs (level 1
// bf16_sr, level 2 sign_ef, level 3 topk_ef21) with their error-feedback state, as a CPU library. A sender encodes
// one compressed region (an owner's shard of a bucket) into a message whose size depends only on the region's
// length and the options; the owner decodes the R messages of its shard into an f32 sum and divides by R
// (level 3 keeps the running estimate h in an Ef21Receiver instead).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mt::optim {

constexpr int kCompressBf16Sr = 1;     // stochastic rounding to bf16, no state
constexpr int kCompressSignEf = 2;     // 1 bit per element + one scale per chunk, error buffer e
constexpr int kCompressTopkEf21 = 3;   // top-k per chunk as int8 + u16 offsets, EF21 estimate h_w
constexpr int64_t kTopkChunk = 65536;  // level 3's chunk: its offsets are u16

// compress.* of the job config (muon.md §7); compress.warmup_steps is the caller's (no encode during warm-up).
struct CompressOptions {
    int level = kCompressSignEf;       // 1, 2 or 3 (0 = off: build no compressor)
    int64_t chunk = 2048;              // level 2: elements per sign chunk (any positive size)
    double topk_density = 1.0 / 24.0;  // level 3: rho in (0, 1]
    uint64_t seed = 0;                 // level 1: the run's seed (Philox key)
};

// What one encode draws its level-1 random bits from, besides the seed: the optimizer step, the bucket id and the
// sending rank. Ranges (checked): step < 2^40, bucket < 2^24, rank < 2^24.
struct CompressKey {
    int64_t step = 0;
    int64_t bucket = 0;
    int64_t rank = 0;
};

// Squared L2 norms of the last encode, summed over the region (all-reduce them for a group-wide ratio):
// p is the codec's input (level 1: g; level 2: g + e; level 3: Delta = g - h_w), C(p) what the message decodes to,
// and e the state error after the encode (level 1: 0; level 2: the error buffer e; level 3: g - h_w).
struct CompressStats {
    double g_sq = 0, p_sq = 0, err_sq = 0, e_sq = 0;  // ||g||^2, ||p||^2, ||C(p) - p||^2, ||e||^2
    // Sums of several regions (chunks, codecs, buckets) add field by field.
    CompressStats& operator+=(const CompressStats& o) {
        g_sq += o.g_sq, p_sq += o.p_sq, err_sq += o.err_sq, e_sq += o.e_sq;
        return *this;
    }
    // ||e|| / ||g||, which must stay bounded (0 when g = 0).
    double ef_ratio() const;
    // ||C(p) - p|| / ||p|| (0 when p = 0).
    double compression_error() const;
};

// Message layouts. All multi-byte fields little-endian; n = the region's length; no header (both sides know n and
// the options), and message_bytes(n) is a function of n and the options alone.
//
// Level 1, bf16_sr: n x u16, element i's bf16 bits at byte 2i. bf16 = f32 rounded toward zero or away from it with
// probability |x - lo| / (hi - lo) (core::f32_to_bf16_stochastic), the 16 random bits from Philox4x32-10
// (core::philox4x32) with key = seed, stream = step << 24 | bucket and counter = rank << 40 | (j / 4), word j % 4,
// where j = first_element + i (the element's index in its bucket). |x| above bf16's largest finite value
// (3.3895e38) may round to infinity. message_bytes = 2n.
//
// Level 2, sign_ef: the region is cut into chunks of C = chunk elements; the last has L = n - C*floor(n/C) if that
// is non-zero. Each chunk of length L (C or the last one's own length) is ceil(L/8) bytes of bits, element 8j+i of
// the chunk at bit i (LSB first) of byte j, unused high bits of the last byte 0, then sigma as f32, with
// sigma = ||p_chunk||_2 / sqrt(L) (the chunk's own length, so a short last chunk keeps an RMS scale) and
// bit = 1 iff p >= 0 (-0 too). It decodes to sigma * (2 bit - 1). message_bytes = sum over chunks of ceil(L/8) + 4,
// i.e. 1 + 32/C bits per element when 8 | C and C | n.
//
// Level 3, topk_ef21: chunks of kTopkChunk = 65536 elements (the last one shorter, length L), each holding
// k(L) = clamp(llround(rho * L), 1, L) kept elements (2731 of a full chunk at rho = 1/24):
//     f32 scale | k x u16 offset within the chunk, strictly increasing | k x int8 value
// The kept elements are the k largest |Delta| of the chunk, ties broken toward the lower index; scale =
// max |kept| / 127 (f32), value = clamp(round-half-away(Delta / scale), -127, 127) (0 when scale = 0), and each
// decodes to float(value) * scale at its offset (every other element of the chunk decodes to 0).
// message_bytes = sum over chunks of 4 + 3 k(L).

// One compressed region of one sender (n elements of a bucket starting at first_element) and its state: level 2's
// error buffer e, level 3's EF21 estimate h_w (both f32 [n], zero at construction; none for level 1). Encodes run
// in step order; OpenMP over chunks, results independent of the thread count.
class GradCompressor {
   public:
    // Checks the options (level, chunk, topk_density); n >= 0.
    GradCompressor(const CompressOptions& options, int64_t n, int64_t first_element = 0);

    // Message size for a region of n elements under these options.
    static int64_t message_bytes(const CompressOptions& options, int64_t n);
    int64_t message_bytes() const {
        return message_bytes(options_, n_);
    }

    // Compresses g and updates the state (level 2: e <- p - C(p); level 3: h_w <- h_w + C(Delta)).
    // @param[in] g    this rank's gradient of the region [n], finite (on overflow, skip the step before encoding;
    //                 a non-finite g fails the check before any state changes)
    // @param[in] key  step, bucket and rank (level 1's random bits; ignored by levels 2 and 3)
    // @param[out] out message_bytes() bytes, overwritten in full
    void encode(std::span<const float> g, const CompressKey& key, std::span<uint8_t> out);
    std::vector<uint8_t> encode(std::span<const float> g, const CompressKey& key);

    // acc += C(p), the values a message decodes to (acc.size() is the region's n; the message must be
    // message_bytes(options, n) long; level 3's offsets and values are validated).
    static void decode_add(const CompressOptions& options, std::span<const uint8_t> message, std::span<float> acc);
    void decode_add(std::span<const uint8_t> message, std::span<float> acc) const {
        decode_add(options_, message, acc);
    }

    // The sender state, raw f32 [n] (empty for level 1), for checkpoints (kind "ef", per rank) and for a warm
    // start (e.g. level 3's h_w set to g on the last uncompressed step, with the receiver's h set to the mean).
    std::span<const float> state() const {
        return state_;
    }
    std::span<float> state() {
        return state_;
    }
    // Copies a saved state in (size n for levels 2 and 3, 0 for level 1).
    void load_state(std::span<const float> saved);
    // Zeroes the state (resume into another mesh: ef state does not reshard, conventions §5.2).
    void reset_state();

    // Norms of the last encode (all zero before the first).
    const CompressStats& last_stats() const {
        return stats_;
    }
    const CompressOptions& options() const {
        return options_;
    }
    int64_t size() const {
        return n_;
    }

   private:
    CompressStats encode_bf16_sr(std::span<const float> g, const CompressKey& key, std::span<uint8_t> out) const;
    CompressStats encode_sign_ef(std::span<const float> g, std::span<uint8_t> out);
    CompressStats encode_topk_ef21(std::span<const float> g, std::span<uint8_t> out);

    CompressOptions options_;
    int64_t n_ = 0;
    int64_t first_element_ = 0;
    std::vector<float> state_;
    CompressStats stats_;
};

// The owner's sum of one step's R messages for its region: out = (1/R) sum_w decode(messages[w]), summed in f32
// in message order (so the result does not depend on arrival order once the caller orders messages by rank).
// out.size() is the region's n; R = messages.size() >= 1.
void grad_compress_decode_mean(const CompressOptions& options,
                               std::span<const std::span<const uint8_t>> messages,
                               std::span<float> out);

// Level 3's owner-side state for the owner's region [n]: h, the mean of the senders' h_w, which the optimizer
// consumes in place of the reduced gradient. Zero at construction, like the senders' h_w.
class Ef21Receiver {
   public:
    Ef21Receiver(const CompressOptions& options, int64_t n);

    // h <- h + mean_w C(Delta_w) from one step's R messages (ordered by sending rank).
    void update(std::span<const std::span<const uint8_t>> messages);

    // h [n]: what the optimizer reads; also the checkpointed state (mutable for a warm start).
    std::span<const float> h() const {
        return h_;
    }
    std::span<float> h() {
        return h_;
    }
    void load_state(std::span<const float> saved);
    void reset_state();

   private:
    CompressOptions options_;
    std::vector<float> h_;
    std::vector<float> sum_;  // scratch for one step's decoded mean
};

}  // namespace mt::optim
