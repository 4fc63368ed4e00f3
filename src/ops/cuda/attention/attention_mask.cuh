// The attention mask inside the CUDA kernels (AttnParams::doc_start and window, ops/attention.h AttentionMask). Keys
// are counted by position in [0, tk); query `row` (< t) of batch row `b` sits at position off + row (off = tk - t: a
// key prefix before the queries) and sees the keys [key_lo(row), off + row]. key_lo never decreases along a row (a
// document start does not, nor does the position - window + 1), so a query block's first row bounds the key blocks it
// visits from below, and a key block's last viewer (last_query, a binary search) bounds the query blocks from above:
// the kernels visit only the tiles that overlap the band, and apply the mask inside the edge tiles. Bidirectional
// attention (AttnParams::causal false, no window) replaces the diagonal by the end of the query's document: query
// `row` sees [key_lo(row), key_hi(row)], both ends non-decreasing along the rows, and a key's viewers are the queries
// of its document; the flash kernels test a pair inside an edge tile by its two documents (doc_of). Tiles of keys
// start at multiples of their size in key positions, tiles of queries at multiples of theirs in rows, so with a prefix
// the diagonal may cross two key tiles of one query tile: the edge tests compare positions.
#pragma once

#include "ops/cuda/attention/attention_kernels.h"

namespace mt::ops::cuda::attn_mask {

__device__ __forceinline__ bool active(const AttnParams& p) {
    return p.doc_start != nullptr || p.window > 0;
}

// The first key query `row` (< t) sees.
__device__ __forceinline__ int key_lo(const AttnParams& p, int b, int row) {
    const int pos = p.off + row;
    const int lo = p.doc_start != nullptr ? p.doc_start[static_cast<int64_t>(b) * p.tk + pos] : 0;
    return p.window > 0 ? max(lo, pos - p.window + 1) : lo;
}

// One past the last position of the document holding position `pos` of batch row b (tk without a document map): the
// first later position that starts a document, doc_start[s] = s > pos (a binary search: doc_start never decreases).
__device__ __forceinline__ int doc_end(const AttnParams& p, int b, int pos) {
    if (p.doc_start == nullptr) return p.tk;
    const int32_t* row = p.doc_start + static_cast<int64_t>(b) * p.tk;
    int lo = pos + 1, hi = p.tk;  // the answer is in [lo, hi]
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (row[mid] > pos)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// The last key query `row` (< t) sees: itself when causal, its document's last position when not.
__device__ __forceinline__ int key_hi(const AttnParams& p, int b, int row) {
    return p.causal ? p.off + row : doc_end(p, b, p.off + row) - 1;
}

// The first query row that may see key `key` (< tk): the one at its position, or row 0 for a prefix key; when not
// causal, the first query of the key's document.
__device__ __forceinline__ int first_query(const AttnParams& p, int b, int key) {
    if (p.causal) return max(key - p.off, 0);
    const int start = p.doc_start != nullptr ? p.doc_start[static_cast<int64_t>(b) * p.tk + key] : 0;
    return max(start - p.off, 0);
}

// The last query (< t) that sees key `key` (< tk): the largest row >= first_query(key) with key_lo(row) <= key; or
// first_query(key) - 1 when no query sees it (a prefix key before the first query's document or window).
__device__ __forceinline__ int last_query(const AttnParams& p, int b, int key) {
    if (!p.causal) return min(doc_end(p, b, key) - 1 - p.off, p.t - 1);  // its document's last query
    int lo = first_query(p, b, key), hi = p.t - 1;
    if (p.window > 0) hi = min(hi, key + p.window - 1 - p.off);  // window < tk (attention.cu): no overflow
    if (hi < lo) return lo - 1;
    if (p.doc_start == nullptr) return hi;
    if (key_lo(p, b, lo) > key) return lo - 1;  // only a prefix key: the query at its position sees it
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (key_lo(p, b, mid) <= key)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The query blocks (of bm rows) that hold a viewer of some key in [n0, n0 + bn) (n0 < tk): [*first, *end), empty when
// no query sees those keys. Key blocks are visited whole, so a block is listed when any of its keys is seen; the last
// key's last viewer is the last of them all (last_query never decreases along the keys, and a key nobody sees comes
// only before every seen one).
__device__ __forceinline__ void query_blocks(const AttnParams& p, int b, int n0, int bn, int bm, int* first, int* end) {
    const int row0 = first_query(p, b, n0), last = last_query(p, b, min(n0 + bn, p.tk) - 1);
    *first = row0 / bm;
    *end = last < row0 ? *first : last / bm + 1;
}

// The first key block (of bn keys) a query block starting at row m0 (< t) visits.
__device__ __forceinline__ int first_key_block(const AttnParams& p, int b, int m0, int bn) {
    return active(p) ? key_lo(p, b, m0) / bn : 0;
}

// One past the last key block (of bn keys) a query block whose last row is last_row visits: the block holding that
// row's position.
__device__ __forceinline__ int end_key_block(const AttnParams& p, int last_row, int bn) {
    return (p.off + last_row) / bn + 1;
}

// The document of position `pos` (< tk) of batch row b, as its first position (0 without a document map). In a
// bidirectional kernel a query sees a key exactly when both have the same document: one load a pair where the bounds
// key_lo <= key <= key_hi would need doc_end's binary search for each query.
__device__ __forceinline__ int doc_of(const AttnParams& p, int b, int pos) {
    return p.doc_start != nullptr ? p.doc_start[static_cast<int64_t>(b) * p.tk + pos] : 0;
}

// The last keys (key_hi) of a bidirectional query block's first and last rows, and their documents. A row of either
// document shares its end (row_hi), so only rows of a document strictly inside the block need doc_end's binary
// search: at most two searches a thread instead of one a row.
struct BlockHi {
    int doc_first = 0, doc_last = 0, first = 0, last = 0;
};
__device__ __forceinline__ BlockHi block_hi(const AttnParams& p, int b, int m0, int last_row) {
    BlockHi h;
    h.doc_first = doc_of(p, b, p.off + m0);
    h.doc_last = doc_of(p, b, p.off + last_row);
    h.last = key_hi(p, b, last_row);
    h.first = h.doc_first == h.doc_last ? h.last : key_hi(p, b, m0);
    return h;
}
// key_hi(row) of a row (< t) of the block that h describes.
__device__ __forceinline__ int row_hi(const AttnParams& p, int b, int row, const BlockHi& h) {
    const int doc = doc_of(p, b, p.off + row);
    return doc == h.doc_last ? h.last : doc == h.doc_first ? h.first : key_hi(p, b, row);
}

// Bidirectional key-major kernels (the backwards' dk/dv): the document of every key of [n0, n0 + bn), or -1 when
// they span two documents or pass tk (every tile of such a block needs the mask).
__device__ __forceinline__ int block_doc(const AttnParams& p, int b, int n0, int bn) {
    if (n0 + bn > p.tk) return -1;
    const int doc = doc_of(p, b, n0);
    return doc_of(p, b, n0 + bn - 1) == doc ? doc : -1;
}

// Whether the tile of query rows [m0, m0 + bm) against a key block whose keys are all of document key_doc
// (block_doc) holds only seen pairs: every row < t and of that document, its first and last rows (documents are
// contiguous). Two loads a tile, where comparing with key_hi would take doc_end's binary search.
__device__ __forceinline__ bool bidir_tile_full(const AttnParams& p, int b, int m0, int bm, int key_doc) {
    return key_doc >= 0 && m0 + bm <= p.t && doc_of(p, b, p.off + m0) == key_doc &&
           doc_of(p, b, p.off + m0 + bm - 1) == key_doc;
}

// The row max to subtract in an online softmax: a row whose keys so far are all masked has max -inf, and exp2 of
// -inf - (-inf) would be NaN, so it subtracts 0 instead (its probabilities and sum stay 0).
__device__ __forceinline__ float safe_max(float m) {
    return m == -INFINITY ? 0.0f : m;
}

}  // namespace mt::ops::cuda::attn_mask
