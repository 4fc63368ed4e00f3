// The schema rows: every config key with its field, range or allowed values and help line (docs/configs.md is
// generated from them), and the keys that were removed.
#include "train/config_schema.h"

#include <algorithm>
#include <iterator>

#include "train/config_schema_fields.h"

namespace mt::train {

using namespace schema;

std::vector<Field> config_schema(JobConfig& c) {
    auto& r = c.run;
    auto& m = c.model;
    auto& d = c.data;
    auto& t = c.train;
    auto& o = c.optim;
    auto& k = c.checkpoint;
    auto& x = c.metrics;
    auto& e = c.model.moe;
    auto& p = c.parallel;
    std::vector<Field> rows = {
        text("run.name", &r.name, "a label"),
        text("run.dir", &r.dir, "checkpoints and metrics go here"),
        integer("run.seed", &r.seed, 0, 9.0e15, "initialisation and data order (Philox keys)"),
        text("run.device",
             &r.device,
             "`auto` = `cuda` when a GPU is visible, else `cpu`; `--device` overrides",
             {"auto", "cpu", "cuda"}),
        integer("run.threads",
                &r.threads,
                0,
                4096,
                "OpenMP threads; 0 = the cores this process may use (divided by the ranks on this machine when not "
                "pinned)"),
        text("run.precision",
             &r.precision,
             "`auto` = bf16 mixed precision on cuda, f32 on cpu; `fp16` turns on dynamic loss scaling; `bf16` and "
             "`fp16` need cuda (exit 2 on the CPU)",
             {"auto", "f32", "bf16", "fp16"}),
        flag("run.deterministic",
             &r.deterministic,
             "bitwise reproducible kernels; false lets ops pick faster ones whose float sums depend on scheduling "
             "(none is faster yet: docs/training.md)"),
        integer("model.vocab_size", &m.vocab_size, 2, 1 << 30, "embedding rows; every token id must be below it"),
        integer("model.d_model", &m.d_model, 1, 1 << 20, "residual width C"),
        integer("model.n_layers", &m.n_layers, 0, 4096, "blocks"),
        integer("model.n_heads", &m.n_heads, 1, 4096, "query heads Hq"),
        integer("model.n_kv_heads", &m.n_kv_heads, 1, 4096, "key/value heads (GQA); must divide `model.n_heads`"),
        integer("model.head_dim",
                &m.head_dim,
                0,
                4096,
                "head dimension D; 0 = `d_model / n_heads`; even when an attention layer uses RoPE"),
        integer("model.d_ff", &m.d_ff, 1, 1 << 22, "SwiGLU hidden width"),
        integer("model.max_seq_len", &m.max_seq_len, 1, 1 << 24, "longest sequence; at least `train.seq_len`"),
        number_above("model.rope_theta", &m.rope_theta, 0, kInf, "RoPE base"),
        number_above("model.norm_eps", &m.norm_eps, 0, 1, "RMSNorm epsilon"),
        number_above("model.init_std",
                     &m.init_std,
                     0,
                     10,
                     "normal init std; output projections use init_std / sqrt(2 n_layers)"),
        flag("model.tie_embeddings", &m.tie_embeddings, "the LM head shares `embed.weight`"),
        text("model.layer_pattern",
             &m.layer_pattern,
             "token mixer of layer l = `layer_pattern[l % length]`, letters `A` (global softmax attention, GQA) and "
             "`K` (Kimi Delta Attention, [kda.md](kda.md)); the length must divide `model.n_layers` and the pattern "
             "repeats to cover the layers (`\"KKKA\"` with 8 layers is KKKA KKKA; a full-length string names every "
             "layer). `\"A\"` is the dense model"),
        text("model.attn_pos",
             &m.attn_pos,
             "position encoding of the attention layers: `auto` = RoPE when every layer is attention (the dense "
             "model), none (NoPE) when the pattern has a `K`, where KDA's decay and short conv carry position",
             {"auto", "rope", "nope"}),
        integer("attn.window",
                &m.attn.window,
                1,
                1 << 24,
                "sliding window w of the layers in `attn.window_layers`: a query sees itself and the w - 1 keys before "
                "it (and its document's start bounds it; [long_context.md](long_context.md)); at most "
                "`model.max_seq_len`"),
        {.key = "attn.window_layers",
         .ptr = &m.attn.window_layers,
         .help = "the attention layers (1-based layer numbers, each an `A` of `model.layer_pattern`) that use the "
                 "sliding window, the global tokens and `attn.window_rope_base`; `[]` = none",
         .min = 1,
         .max = 4096},
        integer("attn.global_tokens",
                &m.attn.global_tokens,
                0,
                32,
                "learned memory tokens of every window layer: keys and values every query of the layer sees, never "
                "rotated, excluded from the loss (0: none)"),
        flag("attn.sink_logit",
             &m.attn.sink_logit,
             "a learned logit per head added to every softmax attention layer's denominator (gpt-oss's sinks)"),
        number("attn.window_rope_base",
               &m.attn.window_rope_base,
               0,
               kInf,
               "RoPE base of the window layers (Gemma 3's local layers use 10,000); 0 = no position encoding there"),
        integer("kda.num_heads", &m.kda.num_heads, 0, 4096, "KDA q/k heads H; 0 = `model.n_heads`"),
        integer("kda.num_v_heads",
                &m.kda.num_v_heads,
                0,
                4096,
                "KDA value heads HV, a multiple of H (HV > H: grouped value heads); 0 = H"),
        integer("kda.head_dim", &m.kda.head_dim, 0, 256, "KDA key head dim K; 0 = the model's head dimension"),
        integer("kda.head_v_dim",
                &m.kda.head_v_dim,
                0,
                4096,
                "KDA value head dim V; 0 = K. The output gate has rank V and the decay gate rank K (kda.md §1, as "
                "Kimi Linear)"),
        integer("kda.conv_size", &m.kda.conv_size, 1, 64, "short causal conv taps on q, k, v"),
        choice("kda.gate",
               &m.kda.gate,
               "`lower_bound`: g = l·σ(a(u+b)) (bounded, the fast chunk path); `softplus`: g = −a·softplus(u+b), Kimi "
               "Linear as released (unbounded, the slower pairwise path)"),
        number_below("kda.gate_lower_bound",
                     &m.kda.gate_lower_bound,
                     -5,
                     0,
                     "l of the bounded gate: per-token decay at least e^l"),
        flag("kda.gate_use_A_log", &m.kda.gate_use_a_log, "per-head temperature a = exp(A_log); false: a = 1"),
        choice("kda.algorithm",
               &m.kda.algorithm,
               "`chunked`: the chunk algorithm; `recurrent`: the token loop (a slow reference, for tests)"),
        integer(
            "kda.chunk_size", &m.kda.chunk_size, 32, 64, "chunk of the chunked algorithm, 32 or 64 (sub-chunks of 16)"),
        choice("kda.save",
               &m.kda.save,
               "GPU: what the forward keeps for the backward (ops::KdaSaved, [kda.md](kda.md)), freed after the "
               "layer's backward. `none` (the default): the backward recomputes everything (the least memory); "
               "`states_bf16`: the state entering each chunk and Vn alone, in bf16 (768 B per token and value head "
               "at K = V = 128, within the 776 B of fla's chunk_kda), so the backward skips its forward scan (not yet "
               "measured on a GPU: it becomes the default once it has been). From "
               "`tiles` on each level keeps what the one before keeps, and more, in f32: `tiles`: the chunk tiles A, "
               "M, T (768 B at chunk 64), so the backward does not recompute them; `states`: also the states and Vn "
               "(1,536 B more; kda.md §4.6); `workspace`: everything the backward would recompute (also Γ, Qg, Kg, "
               "W: 2,048 B more at K = 128), so the backward runs no forward kernel"),
        choice("attnres.mode",
               &m.attnres.mode,
               "Block Attention Residuals ([attnres.md](attnres.md)): each sub-layer input becomes a learned softmax "
               "mix of the embedding, the completed block sums and the running partial sum; `full` = block with S = "
               "1; `off` = the plain residual stream"),
        integer("attnres.block_size",
                &m.attnres.block_size,
                1,
                4096,
                "S, sub-layers per block (a layer has two: mixer and MLP); at most 32 sources per mix (the embedding "
                "and 31 blocks)"),
        flag("attnres.freeze_queries",
             &m.attnres.freeze_queries,
             "keep the pseudo-queries at zero (the plain model up to RMSNorm epsilon; an ablation)"),
        flag("attnres.pp_cache",
             &m.attnres.pp_cache,
             "pipeline parallelism: each hop sends only the block sums the next stage did not keep from its previous "
             "chunk of the micro-batch ([attnres.md](attnres.md#pipeline-parallelism)); false sends every source of "
             "the chunk's first mix on every hop (the baseline, same results)"),
        number("attnres.residual_blend",
               &m.attnres.residual_blend,
               0,
               1,
               "λ0 of the residual blend (spec §5, an ablation knob): each mix weighs its sources λ/m + (1 − λ)·α; "
               "λ = 1 is the plain pre-norm model"),
        integer("attnres.residual_blend_steps",
                &m.attnres.residual_blend_steps,
                0,
                1e12,
                "K: λ(t) = λ0·max(0, 1 − t/K) at optimizer step t (linear decay to 0); 0 keeps λ = λ0 throughout"),
        choice("recompute.policy",
               &m.recompute.policy,
               "activation recompute (docs/training.md \"Memory\"): `none` keeps every activation for the backward; "
               "`selective` drops the activations of `recompute.modules` and re-runs their part of the forward in the "
               "backward; `full` keeps one block input per `recompute.every` blocks and re-runs those blocks' "
               "forward. Same gradients as `none` (bit for bit on the CPU)"),
        choice_list(
            "recompute.modules",
            &m.recompute.modules,
            "selective: what to drop. `attn_core` (attention q, k, v, output, lse), `kda` (every KDA "
            "activation), `mlp_act` / `moe_act` (SwiGLU outputs), `norm` (RMSNorm outputs), `attnres` (the "
            "AttnRes mixed inputs), `moe_permute` (the rows gathered in expert order), `moe_experts` (the routed "
            "experts' gate, up, SwiGLU and output rows: moe.md's `moe.recompute = \"experts\"`)"),
        {.key = "recompute.every",
         .ptr = &m.recompute.every,
         .help = "full: blocks per kept input (k; one block's input is kept per k blocks); `\"sqrt\"` = the "
                 "integer nearest sqrt(n_layers). At most `model.n_layers`; must be 1 under AttnRes",
         .min = 1,
         .max = 4096,
         .choices = {"sqrt"}},
        integer("loss.chunk_tokens",
                &m.loss_chunk_tokens,
                0,
                1e12,
                "the LM head and cross-entropy run over chunks of this many tokens, so the [tokens, vocab] logits are "
                "never held whole: one [chunk, vocab] buffer, and the backward recomputes each chunk's logits (one "
                "more LM-head matmul). 0, or a micro-batch of at most this many tokens: one chunk, nothing "
                "recomputed"),
        flag("moe.enabled",
             &m.moe_enabled,
             "Mixture-of-Experts FFNs (docs/moe_training.md, spec moe.md): layer l's FFN is an MoE layer when l >= "
             "`moe.first_k_dense`; works with any `model.layer_pattern` and with AttnRes"),
        integer("moe.first_k_dense", &m.moe_first_k_dense, 0, 4096, "leading layers that keep a dense SwiGLU MLP"),
        integer("moe.dense_ffn_dim", &m.moe_dense_ffn_dim, 0, 1 << 22, "width of those dense MLPs; 0 = `model.d_ff`"),
        integer("moe.num_experts", &e.num_experts, 1, 1024, "routed experts n"),
        integer("moe.top_k",
                &e.top_k,
                1,
                1024,
                "experts per token k, at most n; with `quantile` or `sign_bias` balancing n must exceed k"),
        integer("moe.num_shared_experts",
                &e.num_shared_experts,
                0,
                64,
                "always-active experts (fused into one SwiGLU of width `expert_ffn_dim` × count)"),
        integer("moe.expert_ffn_dim", &e.expert_ffn_dim, 1, 1 << 22, "SwiGLU width of one expert"),
        choice("moe.score", &e.score, "router score function"),
        flag("moe.normalize_gates", &e.normalize_gates, "gates = selected scores / their sum (× routed_scale)"),
        number_above("moe.routed_scale", &e.routed_scale, 0, 1e6, "multiplier of the routed experts' gates"),
        number("moe.capacity_factor",
               &e.capacity_factor,
               0,
               1e6,
               "0 = dropless; > 0: an expert keeps at most ceil(T·k/n·CF) rows per micro-batch"),
        choice("moe.drop_policy",
               &e.drop_policy,
               "which rows an over-capacity expert drops: the lowest gates (`probs`), or the last in token order "
               "(`position`)"),
        flag("moe.overlap_dispatch",
             &e.overlap_dispatch,
             "under expert parallelism, run the shared experts' forward while the rows travel to their experts, and "
             "the router's backward while the gradients travel back (the same result bit for bit as false, which "
             "waits for each all-to-all; [distributed.md](distributed.md))"),
        choice("moe.grouped_gemm",
               &e.grouped_gemm,
               "CUDA expert GEMMs: `device` runs one kernel per product for all experts, reading the routing plan on "
               "the GPU (no host synchronisation; bf16 with `d_model` and `expert_ffn_dim` multiples of 8 on Hopper), "
               "`cublaslt` one cuBLASLt GEMM per expert from a host copy of the plan, `auto` (the default) the device "
               "kernel where it applies and is the faster: the forward at up to 1,024 rows an expert (N top_k / E), "
               "the backward's dx at up to 512, its dw on cuBLASLt ([moe.md](moe.md) \"CUDA\")"),
        choice("moe.balance",
               &e.balance.mode,
               "load balancing (spec moe.md §2): Quantile Balancing, DeepSeek-V3's sign update, the auxiliary loss, "
               "or none"),
        choice("moe.modality_bias",
               &e.modality_bias,
               "per-modality routing of image + text batches ([multimodal.md](multimodal.md) \"Per-modality "
               "routing\"): `balanced` keeps one balancer state per modality (a token of modality m selects on s + "
               "b_m; needs `quantile` or `sign_bias`), `learned` adds a learned per-modality offset c_m to the router "
               "logits; both need image data (`data.format = \"shapes\"`) and a vision encoder"),
        integer("moe.quantile.bins", &e.balance.bins, 1, 1 << 20, "Quantile Balancing: histogram bins"),
        integer("moe.quantile.update_interval",
                &e.balance.update_interval,
                1,
                1e9,
                "Quantile Balancing: steps per bias update (100–500 supported)"),
        number("moe.quantile.ema", &e.balance.ema, 0, 1, "Quantile Balancing: EMA of the bias, below 1"),
        number("moe.sign_bias.rate", &e.balance.sign_rate, 0, 10, "sign update: speed γ"),
        flag("moe.sign_bias.centered", &e.balance.sign_centered, "sign update: centre the update over the experts"),
        integer("moe.sign_bias.freeze_after_tokens",
                &e.balance.sign_freeze_after_tokens,
                -1,
                9.0e18,
                "sign update: stop after this many tokens (−1: never)"),
        number("moe.aux_loss.coeff",
               &e.balance.aux_coeff,
               0,
               1e3,
               "α of the auxiliary load-balancing loss (micro-batch scope)"),
        integer("moe.alarm.start_step",
                &e.alarm.start_step,
                0,
                1e12,
                "routing-collapse alarm: conditions count from this step on"),
        integer(
            "moe.alarm.window",
            &e.alarm.window,
            1,
            1e12,
            "routing-collapse alarm: fires when a condition held this many steps in a row (and again every window)"),
        text("moe.alarm.action", &c.moe.alarm_action, "`stop`: write a checkpoint, then exit 7", {"log", "stop"}),
        number("moe.alarm.load_var_threshold",
               &e.alarm.load_var_threshold,
               0,
               kInf,
               "alarm condition: load variance above this"),
        number("moe.alarm.n_eff_fraction",
               &e.alarm.n_eff_fraction,
               0,
               1,
               "alarm condition: effective experts below this fraction of n"),
        number("moe.alarm.hot_load_factor",
               &e.alarm.hot_load_factor,
               0,
               kInf,
               "alarm condition: one expert above this multiple of the mean load (0: off)"),
        flag("moe.alarm.dead_experts", &e.alarm.dead_experts, "alarm condition: the same expert with zero load"),
        integer("moe.log_loads_every",
                &c.moe.log_loads_every,
                0,
                1e12,
                "per-expert loads into metrics.jsonl every this many steps (0: never)"),
        text("data.format",
             &d.format,
             "token file format ([data.md](data.md)); `shapes`: generated image-caption samples, no files "
             "([shapes_dataset.md](shapes_dataset.md), [multimodal.md](multimodal.md)); `webdataset`: tar shards of "
             "images with captions; `image_jsonl`: manifests of image paths and captions ([data.md](data.md))",
             {"llmc", "megatron", "shapes", "webdataset", "image_jsonl"}),
        list("data.paths",
             &d.paths,
             "training files, concatenated in order (tar shards or JSONL manifests for the image formats); required "
             "(at least one) but with `shapes`"),
        list("data.val_paths", &d.val_paths, "validation files; empty = the training stream"),
        text("data.tokenizer", &d.tokenizer, "recorded with the run"),
        flag("data.document_mask",
             &m.document_mask,
             "packed sequences are split into documents at every `data.eot_token`: attention never looks across a "
             "document boundary, KDA's state and short conv restart at each document, RoPE positions restart "
             "([long_context.md](long_context.md)); on the GPU KDA packs the documents on chunk boundaries (varlen). "
             "On by default in a job; a vocabulary without the EOT (the bytes tokenizer's 256) needs "
             "`data.eot_token` or `false`"),
        integer("data.eot_token",
                &m.eot_token,
                -1,
                1 << 30,
                "the token id that ends a document (document masking); -1: the tokenizer's EOT (`bytes`: 256; a "
                "SentencePiece model: its eos id)"),
        integer("train.steps", &t.steps, 0, 1e12, "optimizer steps"),
        integer("train.batch_size", &t.batch_size, 1, 1 << 20, "sequences per micro-batch"),
        integer("train.seq_len", &t.seq_len, 1, 1 << 24, "tokens per sequence; at most `model.max_seq_len`"),
        integer("train.grad_accum", &t.grad_accum, 1, 1 << 20, "micro-batches per step"),
        number_above("train.lr", &t.lr, 0, 10, "peak learning rate"),
        number("train.min_lr_ratio", &t.min_lr_ratio, 0, 1, "final lr / peak lr"),
        integer("train.warmup_steps", &t.warmup_steps, 0, 1e12, "linear warmup"),
        text("train.schedule", &t.schedule, "after warmup", {"cosine", "wsd", "constant"}),
        number("train.decay_ratio", &t.decay_ratio, 0, 1, "WSD: fraction of steps in the final decay"),
        number("train.weight_decay", &t.weight_decay, 0, 10, "AdamW decoupled decay (2-D weights only)"),
        number("train.beta1", &t.beta1, 0, 1, "AdamW first moment"),
        number("train.beta2", &t.beta2, 0, 1, "AdamW second moment"),
        number_above("train.eps", &t.eps, 0, 1, "AdamW epsilon"),
        number("train.grad_clip", &t.grad_clip, 0, kInf, "global-norm clipping; 0 = off"),
        number("train.loss_scale",
               &t.loss_scale,
               0,
               1e30,
               "> 0: a fixed loss scale; 0: dynamic under fp16, none otherwise"),
        number_above("train.loss_scale_init", &t.loss_scale_init, 0, 1e30, "dynamic scaling: the starting scale"),
        integer("train.loss_scale_window",
                &t.loss_scale_window,
                1,
                1e12,
                "dynamic scaling: clean steps in a row before the scale doubles"),
        integer("train.loss_scale_hysteresis",
                &t.loss_scale_hysteresis,
                1,
                1e6,
                "dynamic scaling: overflows tolerated (each skips its step) before the scale halves"),
        number_above("train.loss_scale_min",
                     &t.loss_scale_min,
                     0,
                     1e30,
                     "dynamic scaling: the floor; an overflow at the floor ends the run (exit 7)"),
        integer("train.eval_every",
                &t.eval_every,
                0,
                1e12,
                "steps between validation runs (and after the last step); 0 = never"),
        integer("train.eval_batches", &t.eval_batches, 1, 1e9, "batches per validation run"),
        flag("train.cuda_graphs",
             &t.cuda_graphs,
             "GPU: record each training step's forward and backward kernels once as CUDA graphs and replay them "
             "(the same numbers, fewer launches; docs/training.md \"CUDA graphs\"). Steps run without graphs, with "
             "one line saying why, for MoE layers, more than one process, segments, document masks, the vision tower "
             "or `bench_train --profile`"),
        text("optim.name",
             &o.name,
             "`adamw`: AdamW with the `train.*` hyperparameters for every parameter; `muon`: Muon (`muon.*`) for the "
             "hidden matrices (every linear weight and the expert matrices) and AdamW for the rest (embeddings, LM "
             "head, norms, conv filters, gate vectors; docs/optimizers.md). Under `parallel.zero_stage = 1` each "
             "matrix is owned whole by one data-parallel rank. Muon runs on the CPU and without `parallel.tp` yet",
             {"adamw", "muon"}),
        text("optim.offload",
             &o.offload,
             "`cpu`: the fp32 master weights and the AdamW moments live in pinned host memory; each step copies the "
             "gradients down, updates on the CPU (OpenMP over the arena) and copies the weights back up "
             "(docs/training.md \"Memory\"). Bit for bit the same update as on the device on a CPU run",
             {"none", "cpu"}),
        text("optim.state_dtype",
             &o.state_dtype,
             "the AdamW moments' dtype: `bf16` halves their memory, stored with stochastic rounding (unbiased: the "
             "expected stored value is the f32 one)",
             {"f32", "bf16"}),
        integer("checkpoint.every_steps",
                &k.every_steps,
                0,
                1e12,
                "steps between checkpoints (and the last step); 0 = none"),
        integer("checkpoint.keep_last", &k.keep_last, 1, 1e9, "newest checkpoints kept"),
        integer("checkpoint.keep_every", &k.keep_every, 0, 1e12, "also keep steps that are multiples of this"),
        flag("checkpoint.verify_on_resume",
             &k.verify_on_resume,
             "CRC-32C of each checkpoint file a rank reads on resume, checked as it first reads it (about 0.1 s per "
             "200 MB; sizes are always checked, and loaded weights must be finite either way)"),
        flag("checkpoint.async",
             &k.async,
             "the training loop copies the state at the step boundary and a background thread writes it while the "
             "next steps run (still atomic: temp names, DONE, rename); a checkpoint due while one is being written "
             "waits for it ([operations.md](operations.md)); false: the loop waits for the whole write"),
        integer("metrics.every", &x.every, 1, 1e12, "steps between `train` lines in metrics.jsonl"),
        flag("metrics.jsonl", &x.jsonl, "write `<run.dir>/metrics.jsonl`"),
        flag("metrics.tensorboard",
             &x.tensorboard,
             "write TensorBoard event files to `<run.dir>/tb/`: one event per `train` and `eval` line, all of its "
             "scalars ([operations.md](operations.md))"),
        flag("metrics.prometheus_file",
             &x.prometheus_file,
             "rewrite `<run.dir>/metrics.prom` (Prometheus text format 0.0.4, for node_exporter's textfile "
             "collector) at each `train` and `eval` line ([operations.md](operations.md))"),
        flag("metrics.prometheus_per_expert",
             &x.prometheus_per_expert,
             "also one Prometheus sample per expert for the per-expert loads (`moe/load/lNN`, see "
             "`moe.log_loads_every`); off because the series count is experts x layers"),
        integer("metrics.port",
                &x.port,
                0,
                65535,
                "rank 0 serves `/metrics` (Prometheus 0.0.4), `/api/series`, `/api/events` and the live dashboard `/` "
                "on this TCP port ([operations.md](operations.md)); 0 = off; 9477 is the suggested port"),
        text("metrics.bind",
             &x.bind,
             "the address the endpoint listens on, a numeric IPv4 or IPv6 address; any other than loopback "
             "(127.0.0.1, ::1) serves other machines, unauthenticated, and prints a warning"),
        number("metrics.peak_tflops",
               &x.peak_tflops,
               0,
               1e9,
               "the device's peak TFLOP/s per rank for the `mfu` metric; 0: 989 (dense bf16 of an H100/H200) on a "
               "GPU, no `mfu` on the CPU"),
        flag("metrics.layer_stats",
             &x.layer_stats,
             "per-layer figures on the steps that write a train line: gradient, weight and update norms, update "
             "ratio, activation RMS, KDA gate mean and saturation, AttnRes mix weights and entropy "
             "(`layer/<l>/*`, `attnres/<mix>/*`; [metrics.md](metrics.md))"),
        number_above("metrics.memory_warning",
                     &x.memory_warning,
                     0,
                     1,
                     "a `memory_warning` event and a warning line when `mem/reserved` goes above this fraction of the "
                     "device's memory (the GPU's, or the machine's RAM on the CPU), once each time it crosses "
                     "(docs/training.md); 1 = never"),
        number("health.heartbeat_s",
               &c.health.heartbeat_s,
               0,
               3600,
               "every rank rewrites `<run.dir>/heartbeat/rank_<r>.json` (step, phase, time) at each step end and at "
               "least this often while a step runs, for a supervisor to tell a slow step from a hung one "
               "([operations.md](operations.md)); 0: no heartbeat files"),
        number_above("health.hang_timeout_s",
                     &c.health.hang_timeout_s,
                     0,
                     1e9,
                     "`moetrain supervise`: seconds without any rank's step advancing (three times that in a "
                     "checkpoint or evaluation) before the job counts as hung and is restarted"),
        number("health.kill_grace_s",
               &c.health.kill_grace_s,
               0,
               3600,
               "`moetrain supervise`: seconds between SIGTERM and SIGKILL when it stops a job"),
        text("health.on_stop",
             &c.health.on_stop,
             "`moetrain supervise`: after a health stop (exit 7), `exit` ends supervision, `restart` restarts",
             {"exit", "restart"}),
        text("health.spike_action",
             &c.health.spike_action,
             "what a loss or gradient-norm spike or a non-finite step does ([operations.md](operations.md)): `log` "
             "writes a `loss_spike` / `grad_spike` event and a warning line (a non-finite step stops the run, exit "
             "7); `skip` leaves the parameters, optimizer state, step counter and balancer untouched and drops the "
             "batch; `rollback` restores the last checkpoint and drops the data from it to the bad step; a "
             "non-finite step is first re-run once on the same batch (a clean re-run is a `transient_fault`); `off` "
             "does not look",
             {"off", "log", "skip", "rollback"}),
        integer("health.spike_window", &c.health.spike_window, 3, 1e6, "steps in the detector's window"),
        number_above("health.spike_z",
                     &c.health.spike_z,
                     0,
                     1e6,
                     "a spike: the robust z-score (x - median) / (1.4826 MAD) of the step's loss or gradient norm "
                     "against the window above this"),
        integer("health.spike_warmup",
                &c.health.spike_warmup,
                0,
                1e12,
                "steps judged by nobody first (the early loss falls too fast for a window)"),
        integer("health.max_spikes",
                &c.health.max_spikes,
                0,
                1e12,
                "under `skip` or `rollback`: more bad steps (spikes and non-finite steps) than this within "
                "`health.max_spikes_window` steps stop the run with a checkpoint and exit 7; 0: no limit"),
        integer(
            "health.max_spikes_window", &c.health.max_spikes_window, 1, 1e12, "steps `health.max_spikes` counts over"),
        number("health.drift_tv",
               &c.health.drift_tv,
               0,
               1,
               "`expert_load_drift` alarm: a MoE layer's expert-load distribution over the last `health.drift_window` "
               "steps further than this (total-variation distance) from its slow moving reference"),
        integer("health.drift_window", &c.health.drift_window, 1, 1e9, "steps in the drift alarm's recent window"),
        number("health.memory_alarm",
               &c.health.memory_alarm,
               0,
               1,
               "`memory_pressure` alarm: the memory reserved above this fraction of the device's"),
        number("health.throughput_drop",
               &c.health.throughput_drop,
               0,
               1,
               "`throughput_drop` alarm: a step's tokens/s below this times the median of the last 100 steps "
               "(after `health.spike_warmup` steps)"),
        number_above("health.straggler_ratio",
                     &c.health.straggler_ratio,
                     1,
                     1e6,
                     "`straggler` alarm: a rank busy (its step time less its waits for the others) longer than this "
                     "times the median rank, on average over `health.straggler_window` steps"),
        integer("health.straggler_window",
                &c.health.straggler_window,
                1,
                1e6,
                "steps each rank's busy time is averaged over for the straggler alarm"),
        integer("parallel.tp",
                &p.tp,
                1,
                1 << 20,
                "tensor-parallel size: attention and KDA split by heads, the MLP and shared experts by their hidden "
                "features, the embedding and LM head by vocabulary rows, MoE routed experts spread over tp x ep "
                "(docs/distributed.md); must divide `model.n_heads`, `model.n_kv_heads`, the KDA heads and the "
                "MLP width"),
        flag("parallel.sequence_parallel",
             &p.sequence_parallel,
             "with `tp` > 1, each tp rank holds 1/tp of the token rows outside the tensor-parallel regions (norms, "
             "residual adds, AttnRes mixes): all-gather and reduce-scatter replace the all-reduce, activation memory "
             "divides by tp; `train.batch_size` x `train.seq_len` must divide by `tp`"),
        text("pp.schedule",
             &p.pp_schedule,
             "pipeline schedule over `train.grad_accum` micro-batches: `1f1b` (warm-up forwards, then one forward "
             "and one backward alternately) or `interleaved` (Megatron's schedule over `pp.virtual_stages` model "
             "chunks per rank; `train.grad_accum` a multiple of `parallel.pp`)",
             {"1f1b", "interleaved"}),
        integer("pp.virtual_stages",
                &p.pp_virtual_stages,
                1,
                1024,
                "model chunks per pipeline rank: rank s holds chunks s, s + pp, ...; more than 1 needs `pp.schedule = "
                "\"interleaved\"`"),
        {.key = "pp.layers_per_stage",
         .ptr = &p.pp_layers_per_stage,
         .help = "layers of each of the `parallel.pp` x `pp.virtual_stages` chunks in model order, summing to "
                 "`model.n_layers`; `[]` = balanced by estimated compute (the embedding with the first chunk, the LM "
                 "head with the last)",
         .min = 1,
         .max = 1 << 20},
        flag("parallel.pad_vocab",
             &p.pad_vocab,
             "with `tp` > 1, pad a vocabulary that `tp` does not divide (the last rank's extra rows are zeros, never "
             "looked up, and left out of the softmax); false: such a vocabulary is an error"),
        integer("parallel.cp",
                &p.cp,
                1,
                1 << 20,
                "context-parallel size: every sequence cut into 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r "
                "(zigzag; with `long.segments`, every segment on its own); every sequence length and segment boundary "
                "a multiple of 2 x cp x 64; CPU only yet (docs/distributed.md \"Context parallelism\")"),
        choice("cp.attn",
               &p.cp_attn,
               "with `parallel.cp` > 1, how softmax attention sees the other ranks' keys: `allgather` (all-gather "
               "the keys and values, reduce-scatter their gradients) or `ring` (the key/value shards passed around "
               "the ring while each step's result merges by log-sum-exp; a second ring carries their gradients home)"),
        choice("cp.kda",
               &p.cp_kda,
               "with `parallel.cp` > 1, how a KDA layer's state crosses the ranks: `affine` (every span scanned "
               "from the zero state, the spans' affine maps all-gathered and folded, each span rerun from its true "
               "start state) or `relay` (the state passed span to span in order: serial, the reference)"),
        integer("parallel.ep",
                &p.ep,
                1,
                1 << 20,
                "expert-parallel size: each MoE layer's experts are split over `ep` ranks and the token rows travel "
                "by all-to-all, on CPUs over MPI and on GPUs over NCCL, alone or with `dp` (docs/distributed.md); "
                "must divide `moe.num_experts` and needs `moe.enabled`"),
        integer("parallel.dp",
                &p.dp,
                0,
                1 << 20,
                "data-parallel size; 0 = the rest of the processes, world / (tp cp ep pp)"),
        integer("parallel.pp",
                &p.pp,
                1,
                1 << 20,
                "pipeline-parallel size: consecutive layers in stages, micro-batches (`train.grad_accum`) passed "
                "between them by send/recv (docs/distributed.md); at most `model.n_layers` / `pp.virtual_stages`"),
        number_above("parallel.bucket_mb", &p.bucket_mb, 0, 1 << 20, "data-parallel gradient all-reduce bucket, MiB"),
        integer("parallel.zero_stage",
                &p.zero_stage,
                0,
                1,
                "1: ZeRO-1, AdamW moments sharded over the data-parallel ranks (reduce-scatter, update the owned "
                "slice, all-gather); 0: replicated optimizer (all-reduce)"),
        flag("parallel.poison_gathers",
             &p.poison_gathers,
             "debug (ZeRO-1): before each parameter all-gather, fill every element this rank does not own with NaN, so "
             "a forward that read a bucket before its gather landed would produce a NaN loss (docs/optimizers.md)"),
        integer("long.segments",
                &m.segments.count,
                1,
                1 << 20,
                "J: each row runs as J consecutive segments with exact gradients (docs/long_context.md "
                "\"Sequence segments\"): one segment's activations are held at a time, plus every attention "
                "layer's keys and values and every KDA layer's states. Boundaries on `kda.chunk_size` multiples (2 x "
                "`parallel.cp` x 64 under context parallelism), "
                "balanced by estimated "
                "compute (later segments, whose queries see more keys, are shorter). 1: one pass"),
        integer("long.segment_tokens",
                &m.segments.tokens,
                0,
                1e12,
                "> 0: segments of this many tokens (the last one shorter), in place of `long.segments`; a multiple of "
                "`kda.chunk_size` in a model with KDA layers, of 2 x `parallel.cp` x 64 under context parallelism. 0: "
                "`long.segments` decides"),
        flag("long.offload_kv",
             &m.segments.offload_kv,
             "with segments: every attention layer's key/value cache and its gradient accumulators (and KDA's kept "
             "segment states) live in pinned host memory; each pass stages one layer's rows on the device, the next "
             "layer's on a second stream while the current one computes. Device memory: two layers' staging instead "
             "of every layer's cache; host memory: 4 x tokens x n_kv_heads x head_dim x dtype bytes per attention "
             "layer"),
        flag("long.segment_recompute",
             &c.long_ctx.segment_recompute,
             "the backward re-runs each segment's forward but the last's, from the kept caches (every other "
             "activation is dropped). Only true is offered: holding every segment's activations would need as much "
             "memory as one pass, plus the caches"),
        integer("long.tokens_per_gpu",
                &c.long_ctx.tokens_per_gpu,
                0,
                1e12,
                "> 0: the most tokens a rank holds per pass; a length (train.seq_len, or each `[[long.stages]]` "
                "stage's) whose micro-batch holds more per cp rank (batch_size x seq_len / parallel.cp) runs as "
                "sequence segments of the largest granule multiple that fits, unless `long.segments` or "
                "`long.segment_tokens` is set (docs/long_context.md \"Tokens per GPU\"). 0: off"),
        flag("long.passkey_eval",
             &c.long_ctx.passkey_eval,
             "with `[[long.stages]]`: a passkey-retrieval eval (a 5-digit key at 10 depths, reported, not gated) at "
             "the start of every stage, at the stage's length"),
    };
    for (Field& f : config_schema_muon(c)) rows.push_back(std::move(f));
    for (Field& f : config_schema_vision(c)) rows.push_back(std::move(f));
    // One [loss] table in the docs: the weighting's rows follow loss.chunk_tokens.
    std::vector<Field> loss = config_schema_loss(c);
    const auto chunk =
        std::find_if(rows.begin(), rows.end(), [](const Field& f) { return f.key == "loss.chunk_tokens"; });
    rows.insert(chunk + 1, std::make_move_iterator(loss.begin()), std::make_move_iterator(loss.end()));
    return rows;
}

const std::vector<RemovedKey>& config_removed_keys() {
    static const char* const kSaveHint =
        "kda.save (none, states_bf16, tiles, states or workspace) replaces the booleans kda.save_tiles, "
        "kda.save_states and "
        "kda.save_workspace; the highest level that was true is the one to write";
    static const std::vector<RemovedKey> kRemoved = {
        {"model.residual",
         "attnres.mode = \"off\" | \"block\" | \"full\"",
         "model.residual = \"standard\" is attnres.mode = \"off\", \"block_attnres\" is \"block\", \"full_attnres\" is "
         "\"full\""},
        {"kda.save_tiles", "kda.save = \"tiles\"", kSaveHint},
        {"kda.save_states", "kda.save = \"states\"", kSaveHint},
        {"kda.save_workspace", "kda.save = \"workspace\"", kSaveHint},
    };
    return kRemoved;
}

}  // namespace mt::train
