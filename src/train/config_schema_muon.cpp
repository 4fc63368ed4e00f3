// The [muon] rows of the schema (train/config_schema.h): Muon's hyperparameters under optim.name = "muon".
#include "train/config_schema_fields.h"

namespace mt::train {

using namespace schema;

std::vector<Field> config_schema_muon(JobConfig& c) {
    auto& u = c.muon;
    return {
        number_below("muon.momentum", &u.momentum, 0, 1, "with `optim.name = \"muon\"`: the momentum mu"),
        flag("muon.nesterov", &u.nesterov, "Nesterov momentum: orthogonalise g + mu m instead of m"),
        integer("muon.ns_steps",
                &u.ns_steps,
                1,
                100,
                "Newton-Schulz steps with the quintic coefficients (3.4445, -4.7750, 2.0315)"),
        text("muon.ns_coeffs",
             &u.ns_coeffs,
             "`quintic`: `muon.ns_steps` quintic steps (singular values end in about [0.7, 1.2]); `hybrid`: 8 quintic "
             "steps then 2 of (2, -1.5, 0.5), which pin them near 1 (`muon.ns_steps` unused)",
             {"quintic", "hybrid"}),
        number_above("muon.scale_factor",
                     &u.scale_factor,
                     0,
                     100,
                     "the update is scale_factor x sqrt(max(A, B)) x the orthogonalised A x B matrix: an RMS of "
                     "about scale_factor, an AdamW update's at 0.2, so `train.lr` carries over (Moonlight)"),
        number("muon.weight_decay",
               &u.weight_decay,
               0,
               1e6,
               "decoupled weight decay of the Muon group, times the learning rate (the AdamW group keeps "
               "`train.weight_decay`)"),
        number_above("muon.bucket_mb",
                     &u.bucket_mb,
                     0,
                     1 << 20,
                     "with `parallel.zero_stage = 1`: a gradient bucket holding Muon matrices grows to this many MiB "
                     "and on until it holds 2 matrices per rank of its group; each matrix is owned whole by one rank "
                     "(docs/optimizers.md)"),
        integer("muon.max_owner_group",
                &u.max_owner_group,
                0,
                1 << 20,
                "with `parallel.zero_stage = 1`: at most this many ranks of a data-parallel group own Muon "
                "matrices, the others computing copies (0: every rank); for models with few matrices per rank"),
        flag("muon.per_head",
             &u.per_head,
             "orthogonalise each head's rows of the q, k and v projections (softmax attention and KDA) as a matrix "
             "of its own, with its own scale 0.2 sqrt(max(head_dim, d_model)) (muon.md §2); false: each projection "
             "whole"),
        text("muon.clip",
             &u.clip,
             "`none`: Muon's gradients are never scaled by the global-norm clip, which scales the AdamW group only "
             "(Newton-Schulz discards the magnitude; a clip driven by another group's spike would shrink them to "
             "the 1e-7 epsilon); `own_norm`: clip them by the Muon group's own norm against `train.grad_clip`",
             {"none", "own_norm"}),
        flag("optim.qk_clip",
             &c.optim.qk_clip,
             "QK-clip (either optimizer): after each update, a softmax-attention kv group whose largest pre-softmax "
             "logit S over the step exceeded `optim.qk_clip_tau` gets its query rows scaled by (tau / S)^alpha and its "
             "key rows by (tau / S)^(1 - alpha), so the logit returns to tau; KDA layers need none (tensor "
             "parallelism: not applied yet)"),
        number_above("optim.qk_clip_tau", &c.optim.qk_clip_tau, 0, 1e30, "QK-clip's threshold tau on the logit"),
        number("optim.qk_clip_alpha",
               &c.optim.qk_clip_alpha,
               0,
               1,
               "QK-clip's split alpha: the query rows take (tau / S)^alpha, the key rows the rest"),
        integer("compress.level",
                &c.compress.level,
                0,
                3,
                "gradient compression of Muon's reduce-to-owner leg (`optim.name = \"muon\"`, "
                "`parallel.zero_stage = 1`): 0 off, 1 `bf16_sr` (stochastic rounding, 2x), 2 `sign_ef` (1 bit and "
                "one scale per chunk with error feedback, about 32x), 3 `topk_ef21` (research); measure before use "
                "(docs/optimizers.md)"),
        integer("compress.chunk", &c.compress.chunk, 1, 1 << 30, "level 2: elements per chunk (one f32 scale each)"),
        integer("compress.warmup_steps",
                &c.compress.warmup_steps,
                0,
                int64_t{1} << 40,
                "steps reduced uncompressed before compression starts (error buffers zero until then)"),
        number_above("compress.topk_density",
                     &c.compress.topk_density,
                     0,
                     1,
                     "level 3: the share of each 65536-element chunk sent (as int8 values and u16 offsets)"),
    };
}

}  // namespace mt::train
