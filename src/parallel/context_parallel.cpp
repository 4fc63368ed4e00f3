// The zigzag layout's arithmetic.
#include "parallel/context_parallel.h"

#include "core/error.h"

namespace mt::parallel {

Zigzag zigzag(int64_t cp, int64_t rank, int64_t seq) {
    MT_CHECK(cp >= 1 && rank >= 0 && rank < cp, "rank {} of a cp group of {}", rank, cp);
    MT_CHECK(seq > 0 && seq % (2 * cp) == 0, "a sequence of {} tokens does not cut into 2 x {} chunks", seq, cp);
    return {.cp = cp, .rank = rank, .seq = seq};
}

int64_t Zigzag::position(int64_t i) const {
    MT_CHECK(i >= 0 && i < local(), "local token {} of {}", i, local());
    const int span = i < chunk() ? 0 : 1;
    return span_first(span) + i - span * chunk();
}

ZigzagOwner Zigzag::owner(int64_t g) const {
    MT_CHECK(g >= 0 && g < 2 * cp, "chunk {} of {}", g, 2 * cp);
    return g < cp ? ZigzagOwner{.rank = g, .span = 0} : ZigzagOwner{.rank = 2 * cp - 1 - g, .span = 1};
}

}  // namespace mt::parallel
