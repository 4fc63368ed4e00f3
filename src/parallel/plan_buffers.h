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
// stream's gradients and AttnRes's gradient accumulators, which the backward needs but no layer saves; vision: the
// vision tower, ViT and projector, with its gradient buffers and the splice's slots).
enum class PlanKind : uint8_t { attention, kda, mlp, moe, norm, residual, attnres, embed_head, grad_buffers, vision };
constexpr int kPlanKinds = 10;
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

// The vision tower's buffers for one micro-batch's images (src/parallel/plan_vision.cpp, following
// nn/vision/vision_encoder.cpp, vit_block.cpp and the splice in nn/model_vision.cpp).
struct PlanVision {
    int64_t patches = 0, tokens = 0;  // P patches making M = P / 4 image slots (LM tokens)
    // Kind vision: saved (what the encoder's forward keeps for its backward), or not (its backward's gradient buffers,
    // the patch positions and the splice's slot indices, kept all step from the first backward on).
    std::vector<PlanBuffer> buffers;
    // The allocations alive together in the tower's forward (the pixels' copies on their way to the device) and in
    // its backward (the splice's gradient rows and, on CUDA, the attention backward's scratch).
    std::vector<int64_t> fwd_transient, bwd_transient;
};

// The tower of cfg.vision for a batch of `patches` patches (M = patches / 4 image slots) under `precision`;
// deterministic: run.deterministic (off, the ViT's attention backward may keep an fp32 dq, as the LM's).
PlanVision plan_vision(const nn::ModelConfig& cfg, const nn::Precision& precision, int64_t patches, bool deterministic);

// The most image slots a micro-batch of `batch` rows of `seq` tokens can hold when no image makes more than
// `image_tokens` of them and every image comes with at least `frame_tokens` other tokens of its sample in its row (3:
// <bos>, <img_start>, <img_end>; a sample never splits across rows): a row of k images holds at most
// min(k image_tokens, seq - k frame_tokens) slots, and the bound is the largest of those over k >= 1 (0 when
// image_tokens is 0).
int64_t plan_image_slots(int64_t batch, int64_t seq, int64_t image_tokens, int64_t frame_tokens = 3);

// The attention backward's CUDA scratch (ops/cuda/attention/attention.cu) for [b, t] queries of `heads` heads of
// head_dim: the f32 row sums, and with run.deterministic off the wgmma flash kernel's f32 dq accumulator (bf16, head
// dims that are multiples of 8 up to 128, on tiles of 64 or 128 columns).
int64_t plan_attention_bwd_scratch(
    int64_t b, int64_t heads, int64_t t, int64_t head_dim, core::DType act, bool deterministic);

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
