// Whole-matrix ownership of Muon's matrices under ZeRO-1 (muon.md §3): which rank of a reduction group owns each
// matrix, and the packed layout of a gradient bucket that hands every owner the fully reduced gradients of exactly its
// matrices in one reduce-scatter. Pure functions of the parameter layout and the group size, so every rank computes
// the same table (and a resume onto another group size re-derives it).
//
// A packed bucket of a group of R ranks is R blocks of `shard` elements. Block r holds, back to back:
//   * rank r's slice of the bucket's element-sharded parameters (AdamW's: their real elements concatenated and cut
//     into R near-equal runs, as ZeRO-1 cuts a plain bucket), then
//   * the matrices of owner position r mod R' (R' = min(R, max_owner_group) owner positions), in table order,
// padded with zeros to the largest block. A reduce-scatter of the packed buffer gives rank r the sum of block r: the
// reduced gradients of its slice and of its matrices. The updated parameters go back by an all-gather of the same
// blocks. Matrices are assigned by LPT over their Newton-Schulz cost, descending, each to the position with the least
// accumulated cost (ties: the lowest position); the accumulated cost carries across the buckets of a group.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"

namespace mt::parallel {

struct ArenaParam;

// One whole matrix of a Muon parameter (a stack [E, A, B] has E): parameter `param`'s matrix `index`, arena
// elements [begin, begin + numel).
struct OwnedMatrix {
    int param = 0;
    int64_t index = 0;
    int64_t rows = 0, cols = 0;
    int64_t begin = 0, numel = 0;
    int owner = 0;       // owner position in [0, R')
    bool writer = true;  // GradSync::owned_matrices: this rank is the position's first rank (writes checkpoints)
};

// Newton-Schulz cost of a rows x cols matrix per iteration: 4 p^2 q + 2 p^3 FLOPs (p = min, q = max; muon.md §3).
double newton_schulz_flops(int64_t rows, int64_t cols);

// The LPT load of a group's owner positions, carried from one bucket to the next.
struct OwnerLoad {
    std::vector<double> cost;  // FLOPs per Newton-Schulz iteration, per owner position
};

struct PackedBucket {
    std::vector<std::vector<optim::ArenaRange>> blocks;  // per group rank: its arena ranges in block order
    std::vector<std::vector<optim::ArenaRange>> flat;    // per group rank: the element-sharded part of its block
    std::vector<std::vector<optim::ArenaRange>> owned;   // per group rank: the matrices part (after flat)
    std::vector<OwnedMatrix> matrices;                   // the bucket's matrices, table order, with their owners
    int64_t shard = 0;                                   // elements per block (the largest block)
    int64_t padding = 0;                                 // zero elements of all blocks together
    int64_t payload = 0;                                 // real elements (the bucket's parameters)
};

// The packed layout of parameters [lowest, end) of `params` (matrix_rows > 0 marks a Muon stack) over `ranks`
// group ranks with `positions` owner positions (1 <= positions <= ranks); `load` is updated.
PackedBucket plan_packed_bucket(
    const std::vector<ArenaParam>& params, int lowest, int end, int64_t ranks, int64_t positions, OwnerLoad& load);

}  // namespace mt::parallel
