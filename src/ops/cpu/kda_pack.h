// The packed (varlen) layout of KDA's document masking (ops/kda.h KdaDocuments::packed, run by ops/kda.cpp): host
// integer maps from a document-start map to one packed row per row, each document starting on a chunk boundary and
// its tail padded to a chunk multiple, plus the per-(row, chunk) reset flags (KdaOptions::chunk_reset) that restart
// the state at each document but the row's first. Host code, so the index math is tested on the CPU
// (tests/ops/kda_pack_test.cpp) and the maps are uploaded as they are.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/op_common.h"

namespace mt::ops::cpu {

// Row b of the packed tensors [B, tp, ...] holds row b's documents in order: document i of the row starts at packed
// position p_i = sum_{j < i} ceil(len_j / chunk) * chunk, and positions [p_i + len_i, p_{i+1}) and [p_last end, tp)
// are padding. tp is the longest row's packed length (a multiple of chunk), so rows with less padding get trailing
// padding chunks; those leave the state unchanged (padding is inert), so st and dst still belong to the last document.
struct KdaPackPlan {
    int64_t b = 0, t = 0, chunk = 0;
    int64_t tp = 0;  // packed row length
    int64_t nc = 0;  // tp / chunk
    int64_t documents = 0;
    std::vector<int32_t> src;    // [b * tp]: flat source row (row * t + pos) of each packed position, -1 for padding
    std::vector<int32_t> dst;    // [b * t]: flat packed row (row * tp + p) of each original position
    std::vector<int32_t> reset;  // [b * nc]: 1 at the chunk where a document other than the row's first starts
    bool one_document_per_row() const {
        return documents == b;
    }
};

// The plan of a checked host map doc_start [B, T] i32 (cpu::check_doc_start_map) for chunks of `chunk` tokens. Fails
// (exit 1) when the packed rows would not fit 32-bit row indices.
KdaPackPlan kda_pack_plan(const Tensor& doc_start, int64_t chunk);

}  // namespace mt::ops::cpu
