// The attention mask inside the CUDA kernels (AttnParams::doc_start and window, ops/attention.h AttentionMask): query
// `row` of batch row `b` sees the keys [key_lo(row), row]. key_lo never decreases along a row (a document start does
// not, nor does row - window + 1), so a query block's first row bounds the key blocks it visits from below, and a key
// block's last viewer (last_query, a binary search) bounds the query blocks from above: the kernels visit only the
// tiles that overlap the band, and apply the mask inside the edge tiles.
#pragma once

#include "ops/cuda/attention/attention_kernels.h"

namespace mt::ops::cuda::attn_mask {

__device__ __forceinline__ bool active(const AttnParams& p) {
    return p.doc_start != nullptr || p.window > 0;
}

// The first key query `row` (< t) sees.
__device__ __forceinline__ int key_lo(const AttnParams& p, int b, int row) {
    const int lo = p.doc_start != nullptr ? p.doc_start[static_cast<int64_t>(b) * p.t + row] : 0;
    return p.window > 0 ? max(lo, row - p.window + 1) : lo;
}

// The last query (< t) that sees key `key` (< t): the largest row >= key with key_lo(row) <= key.
__device__ __forceinline__ int last_query(const AttnParams& p, int b, int key) {
    int lo = key, hi = p.t - 1;  // key_lo(key) <= key: the answer is in [key, hi]
    if (p.window > 0) hi = min(hi, key + p.window - 1);
    if (p.doc_start == nullptr) return hi;
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (key_lo(p, b, mid) <= key)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The first key block (of kBN keys) a query block starting at row m0 (< t) visits.
__device__ __forceinline__ int first_key_block(const AttnParams& p, int b, int m0, int bn) {
    return active(p) ? key_lo(p, b, m0) / bn : 0;
}

// The row max to subtract in an online softmax: a row whose keys so far are all masked has max -inf, and exp2 of
// -inf - (-inf) would be NaN, so it subtracts 0 instead (its probabilities and sum stay 0).
__device__ __forceinline__ float safe_max(float m) {
    return m == -INFINITY ? 0.0f : m;
}

}  // namespace mt::ops::cuda::attn_mask
