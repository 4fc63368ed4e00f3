// The memory planner's picture of one micro-batch's activations (parallel/plan_memory.h builds the plan on it):
// every buffer each layer allocates for B x T tokens, with the shapes and dtypes of its resize() and the names of
// its saved_for_backward() list; which of them the recompute policy frees after the forward; the workspace slots each
// layer's backward reserves; and the scratch the CUDA ops allocate inside one call (the KDA chunk workspaces, the
// attention backward's row sums). It follows src/nn/ by hand, which is why it names every buffer:
// tests/parallel/plan_memory_test.cpp holds its saved bytes and workspace to the real CPU model's for every layer
// type and recompute policy, so a layer that changes its buffers fails there until this file follows it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nn/model_config.h"
#include "nn/precision.h"
#include "nn/workspace.h"

namespace mt::parallel {

// The plan's line a buffer counts in: the layer that owns it (norm: a block's two pre-norms; residual: the block's
// h and output; embed_head: the embedding output, the final norm, logits and loss rows; grad_buffers: the residual
// stream's gradients and AttnRes's gradient accumulators, which the backward needs but no layer saves).
enum class PlanKind : uint8_t { attention, kda, mlp, moe, norm, residual, attnres, embed_head, grad_buffers };
constexpr int kPlanKinds = 9;
std::string_view plan_kind_name(PlanKind kind);

struct PlanBuffer {
    PlanKind kind = PlanKind::attention;
    std::string name;  // the name in its layer's saved_for_backward() list (or the member's name when not saved)
    int64_t bytes = 0;
    bool saved = false;    // counted by Model::saved_activation_bytes() while allocated
    bool dropped = false;  // the policy frees it after the forward; its sub-layer allocates it again to rebuild it
                           // in the backward (recompute) and frees it after
};

// One sub-layer of a block (0: its pre-norm and the mixer, 1: its pre-norm and the FFN): the buffers of
// Block::branch_saved(sub) and the layer's other members, and the largest CUDA op scratch alive at once inside its
// forward and its backward (there: the backward's own or its recompute forward's, whichever is larger).
struct PlanSubLayer {
    std::vector<PlanBuffer> buffers;
    int64_t fwd_scratch = 0;
    int64_t bwd_scratch = 0;
    std::string fwd_scratch_op, bwd_scratch_op;  // which op's scratch that is ("kda_bwd", ...)
};

struct PlanBlock {
    std::array<PlanSubLayer, 2> sub;
    PlanBuffer h, out;         // the residual after the mixer, the block output
    bool keeps_output = true;  // recompute full: the output outlives the forward (the last block of a group)
};

// Everything one micro-batch allocates beside the parameter state.
struct PlanActivations {
    std::vector<PlanBuffer> model;    // Model::resize's own buffers
    std::vector<PlanBuffer> attnres;  // AttnResStack::resize's (empty without AttnRes)
    int64_t attnres_mixed = 0;        // one mixed input h_l, the buffer recompute attnres rebuilds per sub-layer
    std::vector<PlanBlock> blocks;
    std::vector<PlanBuffer> workspace;  // d_norm, d_tmp and the slots (each at its largest reservation)
    std::vector<PlanBuffer> comm;       // expert parallelism: the MoE all-to-all's staging rows and row orders
    int64_t full_group = 0;             // recompute full over the plain residual stream: blocks per group (else 0)
    // Recompute full under AttnRes: each sub-layer drops its activations and re-runs its forward in its backward.
    bool branch_recompute = false;
};

// The activations of cfg (its recompute policy included) for a micro-batch of batch x seq tokens under `precision`.
// ep_size > 1: expert parallelism, the expert-side rows assumed balanced (N top_k rows per rank; the layer's buffers
// grow when more arrive). deterministic: run.deterministic (off, the attention backward keeps an fp32 dq).
PlanActivations plan_activations(const nn::ModelConfig& cfg,
                                 const nn::Precision& precision,
                                 int64_t batch,
                                 int64_t seq,
                                 int64_t ep_size,
                                 bool deterministic);

}  // namespace mt::parallel
