// The job config: TOML file + `--set section.key=value` overrides, validated against one schema table
// (train/config_schema.h, which also generates docs/configs.md).
// Malformed TOML, unknown keys (typos), wrong types and out-of-range values end with exit 2 and a message
// naming the file and the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/context_parallel.h"
#include "nn/model_config.h"
#include "nn/precision.h"

namespace mt::train {

struct RunConfig {
    std::string name = "run";
    std::string dir = "runs/run";
    int64_t seed = 1234;
    std::string device = "auto";     // auto (cuda when a GPU is visible) | cpu | cuda
    int64_t threads = 0;             // 0: all cores
    std::string precision = "auto";  // auto (bf16 on cuda, f32 on cpu) | f32 | bf16 | fp16
    bool deterministic = true;       // bitwise reproducible kernels; false allows faster ones (ops/op_common.h)
};

// The eval controls of the shapes set (multimodal.md §6, docs/multimodal.md): each is one more eval over the val
// batches in another view (comp_val: the compositional split).
enum class ShapesControl { zeroed, shuffled, flipped, res112, res336, comp_val };

}  // namespace mt::train

namespace mt::nn {
template <>
struct EnumNames<train::ShapesControl> {
    static constexpr std::array<std::pair<train::ShapesControl, const char*>, 6> names = {{
        {train::ShapesControl::zeroed, "zeroed"},
        {train::ShapesControl::shuffled, "shuffled"},
        {train::ShapesControl::flipped, "flipped"},
        {train::ShapesControl::res112, "res112"},
        {train::ShapesControl::res336, "res336"},
        {train::ShapesControl::comp_val, "comp_val"},
    }};
};
}  // namespace mt::nn

namespace mt::train {

// data.shapes.*: the synthetic shapes image-caption set of data.format = "shapes" (docs/shapes_dataset.md).
struct ShapesDataConfig {
    int64_t seed = -1;  // -1: run.seed
    int64_t stage = 4;  // the debug ladder: 1 color, 2 + shape, 3 + position, 4 the full scenes
    int64_t max_objects = 3;
    std::vector<std::string> held_out = {"green triangle", "cyan cross"};  // "color shape" pairs
    int64_t val_size = 2000;
    std::string format = "caption";  // caption | vqa
    int64_t max_canvas = 336;        // canvas sides from 112, 168, ... up to this
    bool text_only = false;          // the text-only twin: samples without their image block (control 1)
    std::vector<ShapesControl> controls = {ShapesControl::flipped, ShapesControl::comp_val};  // at every eval
};

struct DataConfig {
    // llmc | megatron | shapes (generated image-caption samples, no files) | webdataset (tar shards of images and
    // captions) | image_jsonl (manifests of image path and caption)
    std::string format = "llmc";
    std::vector<std::string> paths;
    std::vector<std::string> val_paths;
    std::string tokenizer = "bytes";
    ShapesDataConfig shapes;
    bool skip_bad_samples = false;  // image-text data on disk: skip a bad sample with a warning instead of exit 3
    int64_t loader_threads = 0;     // image-text data on disk: images decoded at once per loader; 0 auto (job-wide)
    bool images() const {
        return format == "shapes" || images_on_disk();
    }
    bool images_on_disk() const {
        return format == "webdataset" || format == "image_jsonl";
    }
};

// One `[[data.sources]]` entry (docs/data.md "Mixed sources"): a data source of its own format and keys, drawn for a
// row with probability weight / (the sum of the weights); `name` tags its rows' loss (loss/<name>).
struct DataSource {
    std::string name;
    double weight = 1.0;
    DataConfig data;
};

// [loss] (multimodal.md §5, docs/multimodal.md "Mixed sources and loss weighting"): how the per-source losses of a
// data.sources mixture combine into the training loss.
struct LossConfig {
    std::string weighting = "token_mean";  // token_mean | uncertainty | gradnorm | dwa
    int64_t dwa_window = 100;              // steps per DWA window
    double dwa_temperature = 2.0;          // DWA's tau
    double uncertainty_lr = 0.0;           // AdamW lr of the uncertainty s_i; 0: the training lr of the step
    double gradnorm_alpha = 1.0;           // GradNorm's asymmetry a
    double gradnorm_lr = 0.025;            // the gradient-descent lr of GradNorm's w
    std::string gradnorm_layer;            // the measured weight W by name; empty: the last shared-expert down
};

struct TrainConfig {
    int64_t steps = 100;
    int64_t batch_size = 8;
    int64_t seq_len = 128;
    int64_t grad_accum = 1;
    double lr = 1e-3;
    double min_lr_ratio = 0.1;
    int64_t warmup_steps = 0;
    std::string schedule = "cosine";  // cosine | wsd | constant
    double decay_ratio = 0.2;
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;   // 0: off
    double loss_scale = 0.0;  // > 0: a fixed scale; 0: dynamic under fp16, none (1) otherwise
    double loss_scale_init = 65536.0;
    int64_t loss_scale_window = 1000;  // clean steps before the dynamic scale doubles
    int64_t loss_scale_hysteresis = 2;
    double loss_scale_min = 1.0;
    int64_t eval_every = 100;
    int64_t eval_batches = 8;
    // Record each training step's forward and backward kernels as CUDA graphs and replay them (docs/training.md
    // "CUDA graphs"); runs without them where the model or layout needs host work between kernels.
    bool cuda_graphs = false;
};

// [optim]: which optimizer updates the weights and where its state lives (docs/training.md "Memory"). The AdamW
// hyperparameters are train.lr, train.beta1, ... (they predate this section).
struct OptimConfig {
    std::string name = "adamw";       // adamw | muon: Muon for the hidden matrices, AdamW for the rest (muon.md §2)
    std::string offload = "none";     // none | cpu: master weights and moments in pinned host memory, update on the CPU
    std::string state_dtype = "f32";  // f32 | bf16: the AdamW moments (bf16 stored with stochastic rounding)
    // QK-clip (muon.md §4): after each update, the query and key rows of a softmax-attention kv group whose largest
    // pre-softmax logit exceeded tau are scaled by (tau / S)^alpha and (tau / S)^(1 - alpha).
    bool qk_clip = true;
    double qk_clip_tau = 100.0;
    double qk_clip_alpha = 0.5;
};

// [muon] (docs/optimizers.md, muon.md §1 and §7): the Muon group's update under optim.name = "muon".
struct MuonConfig {
    double momentum = 0.95;
    bool nesterov = true;
    int64_t ns_steps = 5;
    std::string ns_coeffs = "quintic";  // quintic | hybrid (8 quintic steps, then 2 of (2, -1.5, 0.5))
    double scale_factor = 0.2;          // the update is scale_factor x sqrt(max(A, B)) x the orthogonalised matrix
    double weight_decay = 0.1;          // decoupled, times the learning rate
    double bucket_mb = 64.0;            // ZeRO-1: gradient buckets holding whole-owned matrices (muon.md §3)
    int64_t max_owner_group = 0;        // ZeRO-1: at most this many owners per group (0: every rank)
    std::string clip = "none";          // none | own_norm: clip the Muon group by its own norm (muon.md §5)
    bool per_head = false;              // orthogonalise each head's rows of the q, k, v projections on their own
};

// [compress] (docs/optimizers.md, muon.md §6): gradient compression of Muon's reduce-to-owner leg (ZeRO-1).
struct CompressConfig {
    int64_t level = 0;                 // 0 off | 1 bf16_sr | 2 sign_ef | 3 topk_ef21 (research)
    int64_t chunk = 2048;              // level 2: elements per sign chunk (one f32 scale each)
    int64_t warmup_steps = 1000;       // steps reduced uncompressed first (error buffers zero)
    double topk_density = 1.0 / 24.0;  // level 3: the share of each 65536-element chunk sent
};

struct CheckpointConfig {
    int64_t every_steps = 1000;
    int64_t keep_last = 3;
    int64_t keep_every = 0;
    bool verify_on_resume = true;  // CRC-32C of each file a rank reads on resume (about 0.1 s per 200 MB)
    // run() snapshots the state at the step boundary and writes it from a background thread while training goes on
    // (docs/operations.md "Asynchronous checkpoints"); false: the loop waits for the whole write.
    bool async = true;
};

struct MetricsConfig {
    int64_t every = 1;
    bool jsonl = true;
    // The file views (docs/operations.md). Off by default, as in torchtitan and Megatron-LM, where TensorBoard
    // is asked for.
    bool tensorboard = false;
    bool prometheus_file = false;
    bool prometheus_per_expert = false;
    // The HTTP endpoint and dashboard rank 0 serves (http_endpoint.h): off unless a port is given (9477 is the
    // suggested one); loopback unless another address is set.
    int64_t port = 0;
    std::string bind = "127.0.0.1";
    double memory_warning = 0.95;  // warn when the memory reserved exceeds this fraction of the device's
    // The device's peak for MFU in TFLOP/s per rank; 0: 989 (dense bf16 of an H100/H200) on a GPU, no MFU on the CPU.
    double peak_tflops = 0.0;
    // The per-layer gradient and weight norms (layer/<l>/*) on the metrics steps (metric_registry.h).
    bool layer_stats = true;
};

// [health]: what keeps a long job observable to a supervisor (operations.md).
struct HealthConfig {
    double heartbeat_s = 5.0;  // seconds between a rank's heartbeat writes while a step runs; 0: no heartbeat files
    // What `moetrain supervise` reads from the job it runs (its options override them): a hang is no rank's step
    // advancing for hang_timeout_s (x3 in a checkpoint or evaluation); stopping a job waits kill_grace_s between
    // SIGTERM and SIGKILL; a health stop (exit 7) ends supervision (exit) or is restarted.
    double hang_timeout_s = 300.0;
    double kill_grace_s = 30.0;
    std::string on_stop = "exit";
    // The spike detector (operations.md §4): robust z-scores of the loss and the gradient norm over a window.
    // What a spike or a non-finite step does (operations.md §4, docs/operations.md "Bad steps"): off | log | skip |
    // rollback; more than max_spikes of them within max_spikes_window steps stop the run (checkpoint, exit 7).
    std::string spike_action = "log";
    int64_t spike_window = 100;
    double spike_z = 6.0;
    int64_t spike_warmup = 100;
    int64_t max_spikes = 10;
    int64_t max_spikes_window = 1000;
    // The multi-step alarms (operations.md §5, train/alarms.h): expert-load drift, memory pressure, throughput drop
    // and straggler rank.
    double drift_tv = 0.2;
    int64_t drift_window = 50;
    double memory_alarm = 0.95;
    double throughput_drop = 0.7;
    double straggler_ratio = 1.2;
    int64_t straggler_window = 20;
};

// [parallel]: the device mesh (src/parallel/mesh.h) and how data-parallel gradients are reduced.
struct ParallelConfig {
    int64_t tp = 1;
    int64_t cp = 1;
    int64_t ep = 1;
    int64_t dp = 0;  // 0: the rest of the processes (world / (tp cp ep pp))
    int64_t pp = 1;
    double bucket_mb = 25.0;        // gradient all-reduce bucket size in MiB (PyTorch DDP's default)
    int64_t zero_stage = 1;         // 1: ZeRO-1, optimizer state sharded over the data-parallel ranks; 0: replicated
    bool poison_gathers = false;    // debug: NaN in what other ranks own before each ZeRO-1 parameter gather
    bool sequence_parallel = true;  // tp > 1: the residual stream split over the tp ranks along the token rows
    bool pad_vocab = true;          // tp > 1: a vocabulary tp does not divide is padded (else exit 2)
    // [pp]: pipeline parallelism's schedule and stage split (docs/distributed.md "Pipeline parallelism").
    std::string pp_schedule = "1f1b";          // 1f1b | interleaved
    int64_t pp_virtual_stages = 1;             // model chunks per pipeline rank (interleaved: > 1)
    std::vector<int64_t> pp_layers_per_stage;  // layers of each of the pp x virtual_stages chunks; [] = balanced
    // [cp]: how the token mixers cross the cp ranks (docs/distributed.md "Context parallelism").
    nn::CpAttnMode cp_attn = nn::CpAttnMode::allgather;
    nn::CpKdaMode cp_kda = nn::CpKdaMode::affine;
};

// The [moe] keys that the trainer reads and the MoE layer does not: what a routing-collapse alarm does, and how often
// the per-expert loads are logged. (The balancing method, moe.balance, is model.moe.balance.mode.)
struct MoeRunConfig {
    std::string alarm_action = "log";  // log | stop (checkpoint, then exit with code 7)
    int64_t log_loads_every = 100;     // per-expert loads into the JSONL every this many steps (0: never)
};

// One `[[long.stages]]` entry of the context-length curriculum (docs/long_context.md "Curriculum").
struct LongStage {
    int64_t seq_len = 0;          // tokens per row in this stage
    int64_t tokens = 0;           // training tokens of the stage (the last stage runs on to train.steps)
    double long_fraction = -1.0;  // share of rows from long documents, the rest replay of the short mix; < 0 (left
                                  // out): the natural mix, windows of the whole stream as without a curriculum
    double rope_base = 0.0;  // the global attention layers' RoPE base from this stage on (ABF); 0: model.rope_theta
};

// [long]: long-context training (docs/long_context.md). `stages` is an array of tables, parsed beside the schema
// (train/config_long.cpp), since the schema's rows are scalars and string arrays.
struct LongConfig {
    std::vector<LongStage> stages;  // empty: no curriculum, train.seq_len throughout
    bool passkey_eval = true;       // a passkey-retrieval eval at the start of every stage
    bool segment_recompute = true;  // long.segment_recompute: only true is offered (model segments: ModelConfig)
    // long.tokens_per_gpu: > 0, the most tokens a rank holds per pass; a length whose micro-batch holds more
    // (batch_size x seq_len / parallel.cp) runs as sequence segments (config_segments_for_length). 0: off.
    int64_t tokens_per_gpu = 0;
};

struct JobConfig {
    RunConfig run;
    // The job's defaults differ from the layer library's in one place: document masking is on (data.document_mask,
    // docs/long_context.md "Document masking"), where a bare nn::ModelConfig leaves it off.
    nn::ModelConfig model = [] {
        nn::ModelConfig m;
        m.document_mask = true;
        return m;
    }();
    DataConfig data;
    // [[data.sources]], parsed beside the schema (config_sources.cpp); empty: the single source data.*.
    std::vector<DataSource> data_sources;
    LossConfig loss;
    TrainConfig train;
    OptimConfig optim;
    MuonConfig muon;
    CompressConfig compress;
    CheckpointConfig checkpoint;
    MetricsConfig metrics;
    HealthConfig health;
    MoeRunConfig moe;
    ParallelConfig parallel;
    LongConfig long_ctx;  // [long] (`long` is a C++ keyword)

    std::string source;  // file the config came from (for messages)

    // The resolved config as TOML (every field, defaults included), written into checkpoints and metrics.
    std::string to_toml() const;
};

// The sequence segments a row of seq_len tokens runs as (docs/long_context.md "Tokens per GPU"): the model's own
// (long.segments, long.segment_tokens) when it sets them or long.tokens_per_gpu is 0; else one pass while the
// micro-batch's tokens per cp rank, batch_size x seq_len / parallel.cp, are at most long.tokens_per_gpu, and segments
// of the largest length that keeps them so (a multiple of the segment granule: 2 x cp x 64 under context
// parallelism, else the KDA chunk or 64) beyond it. The curriculum applies it per stage.
nn::SegmentConfig config_segments_for_length(const JobConfig& c, int64_t seq_len);
// Whether any length the job trains at (train.seq_len, or every stage's) runs as segments: what the checks that
// segments need apply to.
bool config_may_segment(const JobConfig& c);

// Parses TOML text (`source` names it in messages) and applies overrides ("section.key=value", value in TOML
// syntax; a bare word is taken as a string). Throws core::Error with ExitCode::usage on any problem.
JobConfig config_parse(const std::string& toml_text,
                       const std::string& source,
                       const std::vector<std::string>& overrides = {});
// The dtypes run.precision names on a GPU (cuda) or on the CPU, where only f32 ("auto" or "f32") runs: any other is
// a usage error naming run.precision. Which device a run uses is the trainer's (or the planner's) decision.
nn::Precision config_precision(const JobConfig& cfg, bool cuda);
// The AdamW moments' dtype optim.state_dtype names, over master weights of dtype `master`.
core::DType config_state_dtype(const JobConfig& cfg, core::DType master);

// Reads the file, then config_parse. A missing file is a usage error naming it.
JobConfig config_load(const std::string& path, const std::vector<std::string>& overrides = {});

// A checkpoint's resolved config (its manifest's config_toml) in today's keys: one saved by an older moetrain spells
// the residual mode twice (model.residual beside attnres.mode; the first is dropped) and what the KDA forward keeps as
// three booleans (kda.save_tiles, kda.save_states, kda.save_workspace; they become kda.save). A user's config with
// those keys fails naming them instead (config_parse). Text that does not parse as TOML comes back unchanged.
std::string config_upgrade_saved(const std::string& saved_toml);

// The reference of every key (docs/configs.md) as Markdown, from the schema: type, default, range or choices and help
// per key, with the cross-key checks and the removed keys. `moetrain config --docs` prints it.
std::string config_docs();

}  // namespace mt::train
