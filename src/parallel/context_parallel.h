// Context parallelism's zigzag layout (long_context.md §7), the pure arithmetic: a sequence of T tokens is cut into
// 2 cp equal chunks and rank r of the cp group holds chunks r and 2 cp - 1 - r, its two "spans", in that order. Under
// causal attention a chunk's cost grows with its index, so pairing chunk r with chunk 2 cp - 1 - r gives every rank
// the same work. No communication here (the tensor moves are nn/context_parallel.h's).
#pragma once

#include <cstdint>

namespace mt::parallel {

// Every chunk is a multiple of this many tokens: the KDA chunk, so that a span's chunked scan cuts exactly where the
// one-pass scan does and the spans' results are those of one pass up to summation order.
constexpr int64_t kCpGranule = 64;

// The chunk and the rank/span of one global chunk index.
struct ZigzagOwner {
    int64_t rank = 0;
    int span = 0;  // 0: the rank's first chunk (index rank), 1: its second (index 2 cp - 1 - rank)
};

struct Zigzag {
    int64_t cp = 1;    // ranks of the cp group
    int64_t rank = 0;  // this rank's place in it
    int64_t seq = 0;   // tokens of the whole sequence, a multiple of 2 cp

    int64_t chunk() const {
        return seq / (2 * cp);
    }
    // Tokens this rank holds: its two chunks.
    int64_t local() const {
        return 2 * chunk();
    }
    // The global chunk index of this rank's span s: rank, then 2 cp - 1 - rank.
    int64_t span_chunk(int span) const {
        return span == 0 ? rank : 2 * cp - 1 - rank;
    }
    // The global position of span s's first token, and of local token i (0 <= i < local()).
    int64_t span_first(int span) const {
        return span_chunk(span) * chunk();
    }
    int64_t position(int64_t i) const;
    // Who holds global chunk g (0 <= g < 2 cp).
    ZigzagOwner owner(int64_t g) const;
};

// The layout of rank `rank` of `cp` over a sequence of `seq` tokens; seq must be a multiple of 2 cp (internal
// error otherwise: the config refuses a length that is not a multiple of cp_granularity first).
Zigzag zigzag(int64_t cp, int64_t rank, int64_t seq);

// The multiple of which every sequence length must be under cp ranks: 2 cp kCpGranule.
inline int64_t cp_granularity(int64_t cp) {
    return 2 * cp * kCpGranule;
}

}  // namespace mt::parallel
