// The trainer: data -> model forward/backward over micro-batches -> clipping -> AdamW, with LR schedule,
// periodic validation, progress lines, JSONL metrics and checkpoints (save, exact resume).
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "data/curriculum.h"
#include "data/sampler.h"
#include "nn/layer_stats.h"
#include "nn/model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/muon.h"
#include "parallel/grad_sync.h"
#include "parallel/mesh.h"
#include "train/alarms.h"
#include "train/async_checkpoint.h"
#include "train/checkpoint_io.h"
#include "train/config.h"
#include "train/heartbeat.h"
#include "train/http_endpoint.h"
#include "train/image_disk_source.h"
#include "train/image_text_source.h"
#include "train/loss_weighting.h"
#include "train/metrics.h"
#include "train/mixed_source.h"
#include "train/spike_detector.h"

namespace mt::train {

// The optimizer's side of a step (muon.md §8; trainer_optim.cpp). Norms are of the reduced gradients with the loss
// scale divided out (the two groups' gradient norms on every step, from the global norm's pass); the other Muon
// figures are over the matrices every rank updated (metrics steps only, else 0).
struct OptimStepMetrics {
    double clip_coef = 1.0;       // kappa of the global-norm clip (it scales the AdamW group)
    double muon_clip_coef = 1.0;  // muon.clip = "own_norm": the Muon group's own kappa
    double muon_grad_norm = 0.0, adamw_grad_norm = 0.0;
    double muon_update_rms = 0.0;  // RMS of the Muon group's change (about scale_factor x lr)
    double n_norm_min = 0.0, n_norm_max = 0.0, n_norm_mean = 0.0;  // ||N||_F over the matrices
    double step_seconds = 0.0, muon_seconds = 0.0;  // the update (both optimizers, QK-clip, the gathers' start)
    int64_t qk_clipped_heads = 0;                   // QK-clip: query heads whose logit exceeded tau
    int64_t muon_overlapped_batches = 0;  // Muon batches stepped as their bucket landed (muon.md §3's overlap)
    double compress_ef_ratio = 0.0, compress_error = 0.0;     // ||e|| / ||g||, ||C(p) - p|| / ||p|| (job-wide)
    int64_t compress_wire_bytes = 0, compress_raw_bytes = 0;  // this step's reduce-to-owner leg, summed over ranks
};

struct StepResult {
    double loss = 0.0;
    double grad_norm = 0.0;
    double lr = 0.0;
    double seconds = 0.0;
    double loss_scale = 1.0;         // the scale this step's backward used
    bool skipped = false;            // an fp16 overflow: no optimizer update
    double aux_loss = 0.0;           // MoE aux balancing loss (mean over micro-batches; not in `loss`)
    double comm_seconds = 0.0;       // data-parallel gradient reduction (the part not overlapped with the backward)
    int64_t buckets_overlapped = 0;  // gradient buckets issued while the backward was still running
    // Pipeline parallelism: the ideal schedule's idle fraction, and this rank's seconds waiting for activations or
    // gradients from the neighbouring stages and running its chunks (re-runs of forwards included).
    double pp_bubble = 0.0, pp_wait_seconds = 0.0, pp_compute_seconds = 0.0;
    // The same per stage of this rank's pipeline (index: the stage), and each stage's peak memory in bytes.
    std::vector<double> pp_stage_wait_seconds, pp_stage_compute_seconds;
    std::vector<int64_t> pp_stage_mem_peak;
    std::vector<std::pair<int64_t, nn::MoeStepMetrics>> moe;  // per MoE layer (block index), this step's routing
    // Memory at the end of the step, in bytes (the backend's statistics, core/backend.h; each the largest over the
    // ranks): handed out now, held from the driver, the most handed out at once during the step, and that peak less
    // Trainer::state_bytes() (the activations, saved tensors and scratch). reserved_fraction: reserved over the
    // device's total memory.
    int64_t mem_allocated = 0, mem_reserved = 0, mem_peak = 0, mem_peak_activations = 0;
    double mem_reserved_fraction = 0.0;
    // The bad-step handling (trainer_health.cpp, docs/operations.md "Bad steps"): the detector's verdicts on this
    // step's loss and gradient norm; whether the first try was non-finite and re-run (transient: the re-run was
    // clean); what happened to a bad step ("" applied, "skipped", "rolled_back") and why ("loss_spike",
    // "grad_spike", "nonfinite"); rolled_back_to: the checkpoint step a rollback restored; health_stop: more bad
    // steps than health.max_spikes in the window (run() checkpoints and exits 7).
    SpikeVerdict loss_spike, grad_spike;
    bool rerun = false, transient_fault = false;
    std::string bad_step, bad_reason;
    int64_t rolled_back_to = -1;
    std::pair<int64_t, int64_t> dropped_data = {-1, -1};  // the data steps a skip or rollback dropped
    bool health_stop = false;
    // metrics.layer_stats, on the steps that write a train line: each layer's squared gradient norm (before clipping,
    // loss scale divided out) and squared weight norm after the update, the whole model's.
    std::vector<double> layer_grad_sq, layer_param_sq;
    // With them, from the sums the step's forwards and optimizer made on the device (one copy to the host, one
    // all-reduce): each layer's squared norm of the change the optimizer applied, and the whole job's slot sums of
    // nn/layer_stats.h (activation moments, KDA gate, AttnRes mixes), indexed by layer_stats_layout's offsets.
    std::vector<double> layer_update_sq, layer_stats;
    // data.sources (trainer_mix.cpp): per source over the global batch, the summed token cross-entropy C_i, the
    // supervised tokens N_i and the weight of loss.weighting; empty without sources.
    std::vector<double> source_loss_sum, source_tokens, source_weight;
    OptimStepMetrics optim;
};

// A fault injected into one step's gradients (tests of the bad-step handling): at the optimizer step that reads data
// step `data_step`, every gradient is multiplied by grad_scale, or made NaN; `times` tries of that step are hit
// (1: a re-run is clean, a transient fault; 2 or more: reproducible).
// straggler_rank (a world rank) sleeps straggler_seconds in every step before the gradient reduction.
// spike_param (a parameter name): instead of scaling, that parameter's reduced gradient gets spike_norm / sqrt(n)
// added to each of its n elements (an L2 norm of spike_norm: muon.md §9 test 7's embedding spike).
// legacy_muon_clip: the global-norm clip scales the Muon group too, the behaviour of Megatron-LM issue #5394 that
// muon.md §5 rules out (tests only: it shows the collapse the default avoids).
struct FaultInjection {
    int64_t data_step = -1;
    double grad_scale = 1.0;
    bool nonfinite = false;
    int64_t times = 1;
    int straggler_rank = -1;
    double straggler_seconds = 0.0;
    std::string spike_param = "";
    double spike_norm = 0.0;
    bool legacy_muon_clip = false;
};

// One rank's communication in one report group (Trainer::comm_traffic): bytes it sent or contributed (Comm::stats:
// an all-reduce's or reduce-scatter's input, an all-gather's own block, an all-to-all's or send's rows), calls
// (barriers and receives too), and host seconds inside the calls and the waits on their handles.
struct CommTraffic {
    int64_t bytes = 0, calls = 0;
    double seconds = 0.0;
};

// The worst MoE layer's MaxVio of a step (0 without MoE layers).
double moe_max_vio(const StepResult& r);

// How Trainer::run ended: every step done, or a graceful stop on SIGTERM/SIGINT after a checkpoint (the CLI exits
// with ExitCode::stopped).
enum class RunEnd { completed, stopped };

class Trainer {
   public:
    // Builds the mesh ([parallel] over `world`, default parallel::dist_world()), the model, optimizer and data
    // pipeline. `log` false keeps it silent (tests, benchmarks); only world rank 0 ever prints or writes metrics.
    explicit Trainer(JobConfig cfg, bool log = true, parallel::Comm* world = nullptr);

    // Restores the newest complete checkpoint under run.dir/checkpoints; false when there is none. A checkpoint
    // found corrupt (a CRC-32C mismatch, a truncated file, a non-finite weight) on any rank is skipped, with a
    // warning, for the previous complete one, on every rank alike; none left intact is exit 4.
    bool resume_latest();
    // Restores a checkpoint directory (params, optimizer state, step, data position); exit 4 when it does not fit or
    // is corrupt (CRC-32C when checkpoint.verify_on_resume, checked per file as this rank first reads it; every
    // loaded weight and moment must be finite), exit 2 when train.steps is below its step. Warns, listing the keys,
    // when the job config differs from the checkpoint's in a key that breaks exact resume (train/config_drift.h).
    void load_checkpoint(const std::string& dir);
    // Trains until train.steps, checkpointing and then validating on schedule. Before each step every rank reads
    // its batches and checks the token files, and the ranks agree on whether to go on: after SIGTERM or SIGINT (on
    // any rank) they write a checkpoint of the last completed step and return RunEnd::stopped; after a token file
    // changed or failed to read they write it and fail with exit 3.
    RunEnd run();
    // One optimizer step at the current step; advances the step counter.
    StepResult train_step();
    // The same step on the caller's batches instead of the sampler's: inputs and targets [grad_accum, batch_size,
    // seq_len] i32 on the host; a target equal to nn::kIgnoreIndex is not supervised.
    StepResult train_step(const core::Tensor& inputs, const core::Tensor& targets);
    // Mean loss over train.eval_batches validation batches (the training stream when no val_paths are set).
    double evaluate();
    // Writes run.dir/checkpoints/step_<step>/.
    void save_checkpoint();
    // The data step optimizer step `step` reads: `step` itself, past the data steps skipped so far (bad steps that
    // were skipped or rolled back over, recorded in every later checkpoint's manifest).
    int64_t data_step(int64_t step) const;
    // Removes data steps [first, end) from the stream: the optimizer steps from the one that would read `first` on
    // read the data after them (a rollback's window; tests build the run a skipped window must equal with it).
    void skip_data(int64_t first, int64_t end);
    const std::vector<std::pair<int64_t, int64_t>>& skipped_data() const {
        return skipped_data_;
    }
    // Tests: a fault for the bad-step handling to find (FaultInjection).
    void inject_fault(const FaultInjection& fault) {
        fault_ = fault;
    }
    // This data-parallel rank's batch of micro-batch `micro` at optimizer step `step` (its data step's samples).
    // With image-text data the images of those rows go to `images` (dropped when null).
    void fill_batch(int64_t step,
                    int64_t micro,
                    const core::Tensor& inputs,
                    const core::Tensor& targets,
                    nn::VisionBatch* images = nullptr) const;
    // The last evaluation's image-blind bound (data.format = "shapes": nats per supervised token of the val batches,
    // multimodal.md §6); 0 before one or for token data.
    double last_eval_bound() const {
        return last_eval_bound_;
    }

    // data.format = "shapes": the last evaluation's val result (loss, bound, greedy scores) and each control's, in the
    // order of data.shapes.controls (comp_val left out where the stage cannot draw it).
    const ShapesEval& last_shapes_eval() const {
        return last_shapes_eval_;
    }
    std::vector<std::pair<ShapesControl, ShapesEval>> last_shapes_controls() const;

    // The model with the weights the forward reads whole: under ZeRO-1 the last step's parameter gathers are
    // waited for first (the trainer's own forwards wait bucket by bucket instead). Under ZeRO-1 with mixed
    // precision the f32 master weights stay sharded: only this rank's slices (GradSync::owned) are current.
    nn::Model& model();
    int64_t step() const {
        return step_;
    }
    const JobConfig& config() const {
        return cfg_;
    }
    // The loss scale the next step's backward uses (1 unless loss scaling is on).
    double loss_scale() const {
        return scaler_.scale();
    }
    // Tokens of the global batch (every rank that reads different data), at the current row length.
    int64_t tokens_per_step() const {
        return rows_per_step() * seq_len_;
    }
    // The model FLOPs of the last step's global batch (docs/PERFORMANCE.md): the LM's per-token count times
    // tokens_per_step, plus 3x the vision tower's forward over this rank's images times the ranks that read different
    // data (each encodes its own; their images differ, the estimate takes this rank's as typical).
    double step_flops() const;
    // Rows of the global batch: batch_size x grad_accum x the ranks that read different data.
    int64_t rows_per_step() const {
        return cfg_.train.batch_size * cfg_.train.grad_accum * data_size();
    }
    // The row length of the current step: train.seq_len, or the curriculum stage's (trainer_long.cpp).
    int64_t seq_len() const {
        return seq_len_;
    }
    // The curriculum stage of the current step (-1 without [[long.stages]]), and the step it started at.
    int64_t stage() const {
        return stage_;
    }
    int64_t stage_first_step() const {
        return stage_ >= 0 ? stage_first_step_[static_cast<size_t>(stage_)] : 0;
    }
    // Training tokens of optimizer steps [0, steps), each at its stage's row length.
    int64_t tokens_seen(int64_t steps) const;
    const parallel::Mesh& mesh() const {
        return *mesh_;
    }
    int64_t dp_size() const {
        return mesh_->size(parallel::MeshAxis::dp);
    }
    int64_t dp_rank() const {
        return mesh_->coord(parallel::MeshAxis::dp);
    }
    // The ranks that read different data: dp_span less cp (ep x dp; expert-parallel ranks route different tokens,
    // the cp ranks of one data rank share its rows, each holding its own tokens of them), and this rank's place among
    // them (dp_span orders its ranks cp fastest).
    int64_t data_size() const {
        return mesh_->group(parallel::MeshGroup::dp_span).size() / mesh_->size(parallel::MeshAxis::cp);
    }
    int64_t data_rank() const {
        return mesh_->group(parallel::MeshGroup::dp_span).rank() / mesh_->size(parallel::MeshAxis::cp);
    }
    // Bytes of optimizer state this rank holds (ZeRO-1: about the total divided by the ranks that read different
    // data), and the whole model's (both moments of every parameter at its global shape).
    int64_t optimizer_state_bytes() const {
        return adamw_->state_bytes() + (muon_ ? muon_->state_bytes() : 0);
    }
    int64_t optimizer_state_bytes_total() const;
    // Bytes of the state this rank holds for the whole run: the parameter arenas (the forward's weights, the master
    // weights where they are a separate copy, the gradients) and the optimizer's moments.
    int64_t state_bytes() const;
    int64_t gradient_buckets() const {
        return grad_sync_->num_buckets();
    }
    // optim.name = "muon": the Muon group's optimizer (the matrices this rank holds); nullptr under AdamW.
    const optim::Muon* muon() const {
        return muon_.get();
    }

    // This rank's communication since the trainer was built, per report group: "tp", "cp", "ep", "dp" (dp_span, edp,
    // stage and dp: gradient reductions, ZeRO-1 gathers, data-parallel scalars), "pp" and "world" (every communicator
    // of the group of more than one rank, MPI and NCCL; trainer_comm.cpp, docs/distributed.md).
    std::map<std::string, CommTraffic> comm_traffic() const;

    // Routing-collapse alarms raised so far (all MoE layers).
    int64_t moe_alarms_total() const {
        return moe_alarms_total_;
    }

    // Pipeline parallelism: every model chunk's layers [first, last) in model order (parallel.pp x
    // pp.virtual_stages of them; pp.layers_per_stage or the cost-balanced split).
    std::vector<std::pair<int64_t, int64_t>> pipeline_chunks() const;

   private:
    // trainer_dist.cpp: the layouts this trainer runs (exit 2 for the others), and the sum of a per-rank value over
    // the ranks that read different data.
    void check_parallel_layout() const;
    // optim.name = "muon": what the Muon step does not run yet (compression of GPU gradients) ends with exit 2.
    void check_muon_layout() const;
    // train.cuda_graphs (trainer_memory.cpp): turns the model's captured steps on where this run allows them, or
    // says on stdout (rank 0) why its steps run without.
    void setup_cuda_graphs();
    // The Muon optimizer: replicated, or over the matrices GradSync assigned this rank (logs the ownership balance).
    std::unique_ptr<optim::Muon> make_muon() const;
    // trainer_optim.cpp: the update of both optimizer groups (the clip rule of muon.md §5, QK-clip), its metrics,
    // and the start of the parameter gathers.
    void optimizer_step(StepResult& r, bool layer_stats);
    void add_optim_metrics(const StepResult& r, nlohmann::json& fields) const;
    // QK-clip (muon.md §4) on the rows this rank updated; returns the query heads clipped (this rank's layers).
    int64_t qk_clip();
    // Whether this step stages Muon per gradient bucket inside the reduction's wait (muon.md §3): whenever the
    // gradients reach Muon unchanged after their reduction (no own-norm clip, no dynamic loss scale, no kv replica sum,
    // no fault injection).
    bool muon_overlaps() const;
    // The reduction's per-bucket hook that stages Muon (empty when this step does not overlap); resets the stages.
    std::function<void(int)> muon_stage_hook(const StepResult& r);
    double muon_stage_seconds_ = 0.0;  // this step's Muon stages (inside the reduction's wait)
    // Resume: the compression error buffers this rank wrote, or zeros when the checkpoint's mesh differs.
    void load_compress_state(const Checkpoint& ckpt);
    // The checkpoint name (kind "ef") of this rank's compression state st.
    std::string compress_state_name(const parallel::CompressedReduce::State& st) const;
    double dp_sum(double value);

    // trainer_guard.cpp: reading a step's batches ahead of its collectives, the agreed stop before each step, the
    // validation tokens checked at the start, and the hint of a non-finite loss.
    int64_t step_status();
    RunEnd stop_run(int64_t status);
    void check_validation_data() const;
    void save_checkpoint_if_new();
    std::string nonfinite_hint() const;
    // trainer_checkpoint.cpp: load_checkpoint's work without output (a damaged checkpoint throws CheckpointCorrupt),
    // the tensors' part of it, and the lines about the resume (config drift, where from).
    void load_checkpoint_state(const std::string& dir);
    // Checkpoints written by run(): with checkpoint.async the state is copied at the step boundary and written in
    // the background (async_checkpoint.h); finish_checkpoint_write waits for such a write and completes it (a new
    // checkpoint, a rollback, a stop and the run's end call it), poll_checkpoint_write completes it at a step
    // boundary once every rank's file is in. checkpoint_saved: the bookkeeping, line and event of a complete one.
    void write_checkpoint(bool async);
    // What this rank's checkpoint file holds (trainer_checkpoint.cpp), and the asynchronous writer's snapshot buffers
    // for it allocated when the run starts (with checkpoint.async, when a checkpoint is due before the last step).
    std::vector<CheckpointTensor> checkpoint_tensors();
    void reserve_checkpoint_buffers();
    void finish_checkpoint_write();
    void poll_checkpoint_write();
    void checkpoint_saved(const std::string& dir, int64_t step, double blocking, double write, bool async);
    std::unique_ptr<AsyncCheckpointWriter> async_writer_;
    double checkpoint_blocking_seconds_ = 0.0;  // the training loop's wait for the last checkpoint started
    // Where that wait went (the checkpoint event's `phases`): collecting the tensors and the manifest, the snapshot
    // copies (async) or the device-to-host copies (blocking), starting the writer or writing the files.
    double checkpoint_prepare_seconds_ = 0.0, checkpoint_copy_seconds_ = 0.0;  // the rest: start or write
    void read_checkpoint_tensors(const Checkpoint& ckpt);
    void report_resume();

    // trainer_memory.cpp: the step's memory figures (the peak reset as it starts, the rest read as it ends), their
    // metrics fields and the warning event when the memory reserved nears the device's.
    void memory_step_begin();
    void memory_step_end(StepResult& r);
    void add_memory_metrics(const StepResult& r, nlohmann::json& fields) const;
    void handle_memory_events(const StepResult& r);

    // trainer_comm.cpp: the train line's comm/<group>/{bytes,calls,seconds}: comm_traffic() now less at
    // comm_step_begin(), which run() calls just before each train_step.
    void comm_step_begin();
    void add_comm_metrics(nlohmann::json& fields) const;
    // Each report group's communicators (tp, cp, ep, dp, pp, world), and the host seconds this rank spent in all of
    // them (each communicator once) since the trainer was built: a rank's waits for the others.
    std::array<std::vector<const parallel::Comm*>, 6> comm_members() const;
    double comm_seconds_total() const;
    double comm_seconds_at_step_start_ = 0.0;
    // This rank's busy seconds and steps since the last train line (the straggler alarm, trainer_health.cpp).
    double straggler_busy_seconds_ = 0.0;
    int64_t straggler_steps_ = 0;

    // trainer_long.cpp: the context-length curriculum (docs/long_context.md): the document index and the stage
    // schedule at construction; before each step, the stage of step_ (its sampler, row length and buffers); at a
    // stage's first step, its event and passkey eval; the long-context metrics fields; the stage in the checkpoint
    // manifest.
    void long_setup();
    void long_prepare_step();
    void long_stage_start();
    void add_long_metrics(nlohmann::json& fields);
    nlohmann::json long_checkpoint_json() const;
    nlohmann::json long_position(int64_t step) const;  // {stage, stage_step, stage_tokens} of a step; {} without stages
    void long_check_checkpoint(const nlohmann::json& data, int64_t step, const std::string& dir) const;

    // trainer_moe.cpp: the MoE layers' metrics fields, warning/alarm events, and balancer checkpoint state.
    void add_moe_metrics(const StepResult& r, nlohmann::json& fields) const;
    void handle_moe_events(const StepResult& r);
    // trainer_health.cpp: bad steps. The step's gradients (zeroed, every micro-batch's forward and backward, the
    // reduction, the loss and the norm; the injected fault); the detector's verdicts; a bad step's outcome (a
    // re-run of a non-finite one, skip or rollback, the max_spikes count); their metrics, events and checkpoint
    // state.
    void compute_gradients(StepResult& r);
    StepResult& finish_step(StepResult& r, std::chrono::steady_clock::time_point start);  // memory figures, time
    void apply_fault(StepResult& r);
    void observe_spikes(StepResult& r);
    bool handle_bad_step(StepResult& r, const std::string& reason);
    void rollback(StepResult& r);
    void add_health_metrics(const StepResult& r, nlohmann::json& fields) const;
    void handle_health_events(const StepResult& r);
    void add_alarm_metrics(nlohmann::json& fields) const;
    void handle_alarms(const StepResult& r);  // the multi-step alarms (train/alarms.h); collective over the world
    std::optional<AlarmMonitor> alarms_;
    nlohmann::json health_checkpoint_json() const;
    void load_health_checkpoint(const nlohmann::json& manifest);
    void load_health_state(const nlohmann::json& health, bool windows);
    std::optional<SpikeSeries> loss_spikes_, grad_spikes_;  // from the first step judged
    int64_t loss_spikes_total_ = 0, grad_spikes_total_ = 0, nonfinite_total_ = 0, transient_faults_total_ = 0;
    int64_t bad_steps_skipped_total_ = 0, rollbacks_total_ = 0;
    std::deque<int64_t> recent_bad_steps_;                   // steps of the bad steps within max_spikes_window
    std::vector<std::pair<int64_t, int64_t>> skipped_data_;  // data steps [first, end) removed, sorted, disjoint
    std::optional<FaultInjection> fault_;
    // trainer_metrics.cpp: the registry's step figures (data_step, flops_per_s, mfu, layer/<l>/*).
    void setup_layer_stats();
    void add_throughput_metrics(const StepResult& r, nlohmann::json& fields) const;
    void add_layer_stats_metrics(const StepResult& r, nlohmann::json& fields) const;
    // The step about to run writes a train line with the per-layer figures (metrics.layer_stats).
    bool layer_stats_step() const {
        return cfg_.metrics.layer_stats && metrics_step();
    }
    bool metrics_step() const {
        return (step_ + 1) % std::max<int64_t>(cfg_.metrics.every, 1) == 0;
    }
    // Before a metrics step's forwards: the zeroed stat buffer for the model; after its update: the buffer and the
    // optimizer's sums to the host, weighed, summed over the world, into r.layer_update_sq and r.layer_stats.
    void layer_stats_begin();
    void layer_stats_end(StepResult& r);
    std::vector<int> layer_of_param_;  // each table parameter's layer ("layers.<l>.*"), -1 for the rest
    std::vector<int> norm_group_of_;   // under Muon: 2 x layer (no layer's: the last) + 1 for a Muon matrix (setup)
    nn::LayerStatsLayout stats_layout_;
    // [layout size + 2 x parameters] f64 on the model's device: the layers' slots, then the optimizer's per-parameter
    // squared changes (update_sq_) and squared updated weights (param_sq_): views of the tail, or of a host buffer
    // where the update runs on the host. param_sq_measured_: this step's update wrote param_sq_ for every parameter
    // (AdamW alone, nothing changing the weights after it), so the weight norms need no pass of their own.
    core::Tensor stats_, optimizer_sums_, update_sq_, param_sq_;
    bool param_sq_measured_ = false;
    std::vector<CheckpointTensor> moe_checkpoint_tensors();  // as the layers hold them (the caller copies to host)
    nlohmann::json moe_checkpoint_json();
    void load_moe_checkpoint(const Checkpoint& ckpt);

    // trainer_pipeline.cpp: pipeline parallelism. This rank's model chunks (global layer ranges) from pp.* or the
    // balanced split; the step's micro-batches through them in the schedule's order (weights[m]: micro-batch m's
    // loss weight, grad_scale its backward's multiplier), returning the weighted loss sum (the last stage's, summed
    // over the pipeline); one evaluation batch through the stages; the tied embedding's gradient summed between
    // the first and the last stage.
    // This rank's model chunks (stage, stage + pp, ... of pipeline_chunks()).
    nn::ModelPart pipeline_part() const;
    struct PipeLinks pipe_links() const;      // the pp communicator, the neighbouring stages, activation buffers
    struct AttnResHops attnres_hops() const;  // Block AttnRes: the sources each hop carries
    double pipeline_micro_batches(const std::vector<double>& weights, double grad_scale, StepResult& r);
    double pipeline_evaluate(const core::Tensor& ids, const core::Tensor& targets);
    void pipeline_reduce_tied_embedding();
    bool pipelined() const {
        return mesh_->size(parallel::MeshAxis::pp) > 1;
    }

    JobConfig cfg_;
    bool log_;
    std::unique_ptr<parallel::Mesh> mesh_;
    std::unique_ptr<nn::Model> model_;
    // GPU runs over several processes: NCCL communicators over the dp_span, edp and ep ranks (groups of more than one
    // rank), which move the gradients and the MoE rows; the mesh's MPI groups keep the host scalars.
    // Shared where two groups are the same ranks.
    std::shared_ptr<parallel::Comm> nccl_dp_span_, nccl_edp_, nccl_ep_, nccl_tp_, nccl_stage_, nccl_pp_;
    // Pipeline parallelism with tied embeddings: the first and the last stage (their copies' gradients are summed).
    std::unique_ptr<parallel::Comm> tied_embedding_;
    // Tensor parallelism with fewer key/value heads than tp ranks: the tp ranks holding the same head.
    std::unique_ptr<parallel::Comm> kv_replicas_;
    // After the data-parallel reduction: the replicated key/value heads' gradients summed over their replicas (under
    // ZeRO-1 only the owned slices are read after it, and those are the same slices on every replica).
    void reduce_kv_replicas();
    std::unique_ptr<parallel::GradSync> grad_sync_;
    std::unique_ptr<optim::AdamW> adamw_;
    std::unique_ptr<optim::Muon> muon_;  // optim.name = "muon": the Muon group's optimizer (AdamW has the rest)
    optim::LossScaler scaler_;
    optim::LrSchedule schedule_;
    std::unique_ptr<data::TokenSource> train_source_, val_source_;
    std::unique_ptr<data::Sampler> train_sampler_, val_sampler_;
    std::unique_ptr<MetricsLog> metrics_;
    // Rank 0 with metrics.port set: /metrics and the dashboard, fed by metrics_.
    std::unique_ptr<HttpEndpoint> endpoint_;
    std::unique_ptr<Heartbeat> heartbeat_;  // while run() runs, with health.heartbeat_s > 0
    void beat_phase(Phase p) {
        if (heartbeat_) heartbeat_->set_phase(p);
    }
    core::Tensor inputs_, targets_;  // [B, T] i32
    // Reads every micro-batch of step_ into step_inputs_ / step_targets_ (step_status does it ahead of the step;
    // train_step when nobody did).
    void read_step_batches();
    // data.format = "shapes" (trainer_images.cpp): the image-text sources, and the evaluation over the val split and
    // the controls of data.shapes.controls (multimodal.md §6).
    void images_setup();
    double evaluate_images();
    // The eval forward of inputs_ / targets_ with their images (empty: text only), through the pipeline's stages when
    // pipelined; the mean loss.
    double eval_forward(const nn::VisionBatch& images);
    ShapesEval evaluate_shapes_view(ImageTextSource& source);
    // The fields of an eval line: val_loss, the bound and its ratio, exact match, and each control's.
    nlohmann::json image_eval_fields(double val) const;
    std::unique_ptr<ImageTextSource> image_train_, image_val_;
    std::vector<std::pair<ShapesControl, std::unique_ptr<ImageTextSource>>> image_controls_;
    std::vector<nn::VisionBatch> step_images_;  // [grad_accum]: the images of step_inputs_' micro-batches
    nn::VisionBatch eval_images_;
    double last_eval_bound_ = 0.0;
    ShapesEval last_shapes_eval_;
    std::vector<ShapesEval> last_control_evals_;  // in the order of image_controls_
    // data.format = "webdataset" or "image_jsonl" (trainer_images_disk.cpp): image-text data read from disk, and the
    // evaluation over data.val_paths (else the first training rows), which reports the plain val loss.
    void disk_images_setup();
    double evaluate_disk_images();
    std::unique_ptr<ImageDiskSource> disk_train_, disk_val_;
    bool image_batches() const {
        return image_train_ || disk_train_ || mix_;
    }
    // data.sources (trainer_mix.cpp, docs/multimodal.md "Mixed sources and loss weighting"): the mixed rows and the
    // loss weighting over their sources. mix_step_begin counts each source's tokens of the step (every rank's) and,
    // under gradnorm, measures G_i with one extra forward and backward per source (train/loss_gradnorm.h);
    // mix_micro_forward runs micro-batch m's forward with its rows' weights and adds its rows' losses to C_i;
    // mix_step_end reduces those over the ranks into r, mix_step_applied updates the weighting after an applied
    // step. The eval runs each source's val rows on their own (eval/<name>/loss).
    void mix_setup();
    void mix_step_begin(double n_global, double loss_scale);
    double mix_micro_forward(int64_t micro);
    void mix_step_end(StepResult& r);
    void mix_step_applied(const StepResult& r);
    double evaluate_mix();
    void add_mix_metrics(const StepResult& r, nlohmann::json& fields) const;
    nlohmann::json eval_fields(double val) const;
    std::unique_ptr<MixedSource> mix_;
    std::unique_ptr<LossWeighting> weighting_;
    std::vector<std::vector<int32_t>> mix_row_sources_;  // per micro-batch of the step, each row's source
    std::vector<double> mix_tokens_, mix_loss_sum_;      // N_i (global) and this rank's C_i of the step
    std::vector<double> mix_eval_losses_;                // the last eval's loss per source
    int gradnorm_param_ = -1;                            // loss.weighting = "gradnorm": W's index, at the first step
    // step_inputs_ / step_targets_ at [grad_accum, batch_size, seq_len], once.
    void allocate_step_batches();
    core::Tensor step_inputs_, step_targets_;  // [grad_accum, B, T] i32: the batches step_status read ahead
    int64_t batches_step_ = -1;                // the step those are for
    std::optional<core::Error> data_error_;    // this rank's data failure that step_status reported
    int64_t step_ = 0;                         // optimizer steps completed
    int64_t last_saved_step_ = -1;             // the step of the checkpoint written or loaded last
    std::string last_saved_dir_, resumed_from_, resumed_config_;
    double resume_load_seconds_ = 0.0;  // the last load_checkpoint_state's wall time
    // ... of which the files' CRC-32C checks and the loaded tensors' finiteness checks (the rest: the reads)
    double resume_crc_seconds_ = 0.0, resume_check_seconds_ = 0.0;
    double checkpoint_reserve_seconds_ = 0.0;    // how long reserve_checkpoint_buffers held up the start
    bool checkpoint_blocking_fallback_ = false;  // the snapshot buffers failed: every checkpoint is blocking
    int64_t moe_alarms_total_ = 0;
    std::map<int64_t, std::pair<bool, bool>> moe_warning_flags_;  // per layer: imbalance, bias range warning on
    bool memory_warning_on_ = false;  // mem/reserved was above metrics.memory_warning at the last step
    int64_t seq_len_ = 0;             // the row length of step_ (train.seq_len, or its stage's)
    // comm_traffic() as the last step started.
    std::map<std::string, CommTraffic> comm_step_start_;
    // The curriculum: every document of the training data, the step each stage starts at, the stage of step_ and its
    // sampler; stage_started_ is set when step_ is a stage's first step, until its event is written.
    std::unique_ptr<data::DocIndex> doc_index_;
    std::vector<int64_t> stage_first_step_;
    int64_t stage_ = -1;
    std::unique_ptr<data::CurriculumSampler> stage_sampler_;
    bool stage_started_ = false;
    // The stage's long tokens served so far (add_long_metrics), over its first long_counted_rows_ global rows.
    int64_t long_counted_stage_ = -1, long_counted_rows_ = 0, long_counted_tokens_ = 0;
};

// The precision run.device selects: "cpu" (f32), "cuda" (bf16 mixed precision; exit 5 without a GPU) or "auto"
// (cuda when a GPU is visible, else cpu).
nn::Precision trainer_precision(const JobConfig& cfg);

// Muon's hyperparameters from [muon] (the learning rate is the schedule's, set per step).
ops::MuonHyper trainer_muon_hyper(const JobConfig& cfg);
// The model's arenas as the gradient synchronisation sees them (trainer_dist.cpp): tied_copy, the parameter that is
// one of two copies of a tied embedding (pipeline parallelism) or -1; whole_matrices, Muon's matrices owned whole.
parallel::GradArenas trainer_grad_arenas(const nn::ParamTable& table, int tied_copy, bool whole_matrices);

// The loss scaling of a run: train.loss_scale > 0 fixes it; otherwise dynamic under fp16 and none (1) otherwise.
optim::LossScalerConfig trainer_loss_scaler(const JobConfig& cfg, const nn::Precision& precision);

// Applies run.threads to OpenMP; returns the count. 0: the cores this process may run on, divided by the ranks a
// launcher started on this machine when the process is not pinned.
int trainer_set_threads(int64_t threads);

}  // namespace mt::train
