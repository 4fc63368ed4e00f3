// The training loop: one progress line per step, JSONL metrics, validation and checkpoints on schedule.
#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <thread>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/clock.h"
#include "core/cuda_probe.h"
#include "core/trace.h"
#include "ops/global_norm.h"
#include "parallel/comm_nccl.h"
#include "parallel/runtime.h"
#include "train/config_parallel.h"
#include "train/run_lock.h"

namespace mt::train {

namespace {

// Targets a loss counts: every one but nn::kIgnoreIndex. targets: [B, T] i32 on the host.
int64_t supervised_tokens(const core::Tensor& targets) {
    MT_CHECK(targets.is_contiguous(), "supervised_tokens reads contiguous targets");
    const int32_t* t = targets.data<int32_t>();
    int64_t count = 0;
    for (int64_t i = 0; i < targets.numel(); ++i) count += t[i] != nn::kIgnoreIndex;
    return count;
}

std::string format_duration(double seconds) {
    const auto s = static_cast<int64_t>(std::max(0.0, seconds));
    if (s >= 3600) return fmt::format("{}h{:02d}m", s / 3600, (s / 60) % 60);
    if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
    return fmt::format("{}s", s);
}

}  // namespace

nn::Precision trainer_precision(const JobConfig& cfg) {
    const std::string& device = cfg.run.device;
    const bool cuda = device == "cuda" || (device == "auto" && core::backend_available(core::Device::cuda));
    if (cuda && !core::backend_available(core::Device::cuda))
        core::fail_hint(core::ExitCode::device,
                        "set run.device = \"cpu\" (or \"auto\")",
                        "run.device = \"cuda\" but no CUDA device is available: {} [{}]",
                        core::cuda_describe(),
                        cfg.source);
    nn::Precision p = config_precision(cfg, cuda);
    p.master_on_host = cfg.optim.offload == "cpu";  // the optimizer keeps the master weights beside its state
    return p;
}

optim::LossScalerConfig trainer_loss_scaler(const JobConfig& cfg, const nn::Precision& precision) {
    const auto& t = cfg.train;
    if (t.loss_scale > 0) return {.dynamic = false, .scale = t.loss_scale};
    if (precision.compute != core::DType::f16) return {};
    return {.dynamic = true,
            .scale = t.loss_scale_init,
            .growth_interval = t.loss_scale_window,
            .hysteresis = t.loss_scale_hysteresis,
            .min_scale = t.loss_scale_min};
}

int trainer_set_threads(int64_t threads) {
    // 0: the cores this process may run on, shared out among this machine's ranks when each may run on all of them
    // (mpirun --bind-to none), so that ranks started together do not each take every core, which slows their GPU
    // launches and the NCCL proxy threads. A launcher that pinned the rank has already divided them.
    int n = static_cast<int>(threads);
    if (n <= 0) {
        const int procs = omp_get_num_procs();
        const bool whole_machine = procs == static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
        n = whole_machine ? std::max(1, procs / parallel::dist_local_size()) : procs;
    }
    omp_set_num_threads(n);  // OpenBLAS stays single-threaded: the ops split GEMMs across OpenMP threads
    return n;
}

Trainer::Trainer(JobConfig cfg, bool log, parallel::Comm* world) : cfg_(std::move(cfg)), log_(log) {
    parallel::Comm& comm = world != nullptr ? *world : parallel::dist_world();
    mesh_ = std::make_unique<parallel::Mesh>(comm, config_mesh_shape(cfg_, comm.size()));
    log_ = log && comm.rank() == 0;
    check_parallel_layout();
    trainer_set_threads(cfg_.run.threads);
    core::ExecCtx exec = core::default_exec();
    exec.deterministic = cfg_.run.deterministic;
    core::set_default_exec(exec);  // every op of this process runs under it, on the main lane
    const nn::Precision precision = trainer_precision(cfg_);
    scaler_ = optim::LossScaler(trainer_loss_scaler(cfg_, precision));
    const auto& t = cfg_.train;

    seq_len_ = t.seq_len;
    if (!cfg_.data_sources.empty()) {
        mix_setup();
    } else if (cfg_.data.images_on_disk()) {
        disk_images_setup();
    } else if (cfg_.data.images()) {
        images_setup();
    } else {
        train_source_ = data::token_source_open(cfg_.data.format, cfg_.data.paths, cfg_.model.vocab_size);
        train_sampler_ =
            std::make_unique<data::Sampler>(*train_source_, t.seq_len, static_cast<uint64_t>(cfg_.run.seed));
    }
    if (!cfg_.data.val_paths.empty() && !cfg_.data.images() && !mix_) {
        val_source_ = data::token_source_open(cfg_.data.format, cfg_.data.val_paths, cfg_.model.vocab_size);
        val_sampler_ = std::make_unique<data::Sampler>(*val_source_, t.seq_len, static_cast<uint64_t>(cfg_.run.seed));
    }

    // A GPU run of several processes: NCCL communicators for device buffers, made before any other CUDA work so
    // that this process's device (its local rank) is current for the model, the ops' stream and the allocator.
    if (precision.device == core::Device::cuda && mesh_->world().size() > 1) {
        // At ep = 1 the edp group is dp_span: one communicator serves both (each NCCL communicator has its own
        // stream and proxy threads; a second one over the same ranks cost throughput). The ep group keeps its own
        // even where it equals dp_span (dp = 1): the MoE all-to-alls are waited for on the host, and on a shared
        // stream they would queue behind the gradient buckets the backward issues.
        auto nccl = [&](parallel::MeshGroup g) -> std::shared_ptr<parallel::Comm> {
            if (mesh_->group(g).size() == 1) return nullptr;
            return parallel::comm_make_nccl(mesh_->group(g));
        };
        nccl_dp_span_ = nccl(parallel::MeshGroup::dp_span);
        nccl_edp_ = mesh_->size(parallel::MeshAxis::ep) == 1 ? nccl_dp_span_ : nccl(parallel::MeshGroup::edp);
        nccl_ep_ = nccl(parallel::MeshGroup::tp_ep);  // the MoE rows: the ep group, with tp folded in
        // Tensor parallelism: the regions' activations over tp, the tp-partial gradients over the whole stage.
        nccl_tp_ = nccl(parallel::MeshGroup::tp);
        nccl_stage_ = mesh_->size(parallel::MeshAxis::tp) == 1 ? nccl_dp_span_ : nccl(parallel::MeshGroup::stage);
        nccl_pp_ = nccl(parallel::MeshGroup::pp);  // the activations between the pipeline stages
    }
    // Pipeline parallelism with tied embeddings: the first and the last stage each hold the embedding.
    if (pipelined() && cfg_.model.tie_embeddings) {
        const int64_t stage = mesh_->coord(parallel::MeshAxis::pp), last = mesh_->size(parallel::MeshAxis::pp) - 1;
        const bool end = stage == 0 || stage == last;
        tied_embedding_ = mesh_->group(parallel::MeshGroup::pp).split(end ? 0 : 1, static_cast<int>(stage));
        if (!end) tied_embedding_.reset();
    }
    // Expert parallelism: each MoE layer holds this rank's experts and exchanges rows over the ep group.
    // Under tensor parallelism the tp ranks are further expert-parallel ranks (MoE parallel folding): the experts are
    // spread over tp x ep.
    nn::MoeExpertParallel ep;
    if (cfg_.model.moe_enabled)
        ep = {.size = mesh_->group(parallel::MeshGroup::tp_ep).size(),
              .rank = mesh_->group(parallel::MeshGroup::tp_ep).rank(),
              .comm = &mesh_->group(parallel::MeshGroup::tp_ep),
              .rows_comm = nccl_ep_.get()};
    // Tensor parallelism: each layer holds this rank's shard; the tp ranks read the same batch.
    const nn::TensorParallel tp{.size = mesh_->size(parallel::MeshAxis::tp),
                                .rank = mesh_->coord(parallel::MeshAxis::tp),
                                .sequence_parallel = cfg_.parallel.sequence_parallel,
                                .comm = &mesh_->group(parallel::MeshGroup::tp),
                                .rows_comm = nccl_tp_.get()};
    // Key/value heads fewer than the tp ranks: the ranks holding the same head sum their gradients.
    if (cfg_.parallel.tp > cfg_.model.n_kv_heads) {
        const int64_t replicas = cfg_.parallel.tp / cfg_.model.n_kv_heads;
        kv_replicas_ = mesh_->group(parallel::MeshGroup::tp)
                           .split(static_cast<int>(tp.rank / replicas), static_cast<int>(tp.rank));
    }
    // Every parameter starts at a multiple of the reduction groups' sizes, so each bucket splits evenly (ZeRO-1).
    const int64_t align = std::lcm(std::lcm(mesh_->group(parallel::MeshGroup::dp_span).size(),
                                            int64_t{mesh_->group(parallel::MeshGroup::edp).size()}),
                                   int64_t{mesh_->group(parallel::MeshGroup::stage).size()});
    // Context parallelism: the cp ranks share every batch, each running its zigzag share of the tokens.
    const nn::ContextParallel cp{.size = mesh_->size(parallel::MeshAxis::cp),
                                 .rank = mesh_->coord(parallel::MeshAxis::cp),
                                 .attn = cfg_.parallel.cp_attn,
                                 .kda = cfg_.parallel.cp_kda,
                                 .comm = &mesh_->group(parallel::MeshGroup::cp)};
    model_ = std::make_unique<nn::Model>(cfg_.model, precision, align, ep, tp, pipeline_part(), cp);
    model_->set_segments(config_segments_for_length(cfg_, seq_len_));  // long.tokens_per_gpu (a stage sets its own)
    model_->params().initialize(static_cast<uint64_t>(cfg_.run.seed));
    model_->set_track_max_logit(true);     // long/max_logit: one [B, Hq, T] row maximum per attention layer and pass
    model_->set_max_logit_per_step(true);  // ... over the step's micro-batches (QK-clip's S), reset at each step
    const bool muon = cfg_.optim.name == "muon";
    grad_sync_ = std::make_unique<parallel::GradSync>(
        trainer_grad_arenas(
            model_->params(), tied_embedding_ ? model_->embedding_param() : -1, muon && cfg_.parallel.zero_stage >= 1),
        *mesh_,
        parallel::GradSyncOptions{.bucket_mb = cfg_.parallel.bucket_mb,
                                  .zero = cfg_.parallel.zero_stage >= 1,
                                  .muon_bucket_mb = cfg_.muon.bucket_mb,
                                  .max_owner_group = cfg_.muon.max_owner_group,
                                  .compress = {.level = static_cast<int>(cfg_.compress.level),
                                               .chunk = cfg_.compress.chunk,
                                               .topk_density = cfg_.compress.topk_density,
                                               .seed = static_cast<uint64_t>(cfg_.run.seed)},
                                  .compress_warmup_steps = cfg_.compress.warmup_steps,
                                  .poison_gathers = cfg_.parallel.poison_gathers},
        nccl_dp_span_.get(),
        nccl_edp_.get(),
        nccl_stage_.get());
    // ZeRO-1: each forward waits for the parameter gathers of the last step bucket by bucket, as it reaches them.
    if (grad_sync_->zero())
        model_->set_params_needed_hook([sync = grad_sync_.get()](int end) { sync->params_needed(end); });
    const bool offload = cfg_.optim.offload == "cpu";
    if (offload && grad_sync_->zero())
        core::fail_hint(core::ExitCode::usage,
                        "set parallel.zero_stage = 0 (a replicated optimizer) or optim.offload = \"none\"",
                        "optim.offload = \"cpu\" with parallel.zero_stage = 1 over {} data-parallel ranks is not "
                        "supported yet: the offloaded optimizer updates the whole arena [{}]",
                        mesh_->group(parallel::MeshGroup::dp_span).size(),
                        cfg_.source);
    if (muon) check_muon_layout();
    adamw_ = std::make_unique<optim::AdamW>(
        model_->params(),
        ops::AdamWHyper{.lr = t.lr, .beta1 = t.beta1, .beta2 = t.beta2, .eps = t.eps, .weight_decay = t.weight_decay},
        grad_sync_->zero() ? std::optional(grad_sync_->owned_flat()) : std::nullopt,
        optim::AdamWOptions{
            .state_dtype = config_state_dtype(cfg_, precision.master),
            .offload = offload,
            .seed = static_cast<uint64_t>(cfg_.run.seed),
            .adamw_group_only = muon,
        });
    if (muon) muon_ = make_muon();
    optim::schedule_kind_from_name(t.schedule, &schedule_.kind);
    schedule_.lr = t.lr;
    schedule_.min_lr_ratio = t.min_lr_ratio;
    schedule_.warmup_steps = t.warmup_steps;
    schedule_.total_steps = t.steps;
    schedule_.decay_ratio = t.decay_ratio;

    inputs_ = core::Tensor::zeros({t.batch_size, t.seq_len}, core::DType::i32);
    targets_ = core::Tensor::zeros({t.batch_size, t.seq_len}, core::DType::i32);
    long_setup();
    setup_layer_stats();
    setup_cuda_graphs();  // after long_setup: the segments it may turn on keep the steps eager
    reserve_checkpoint_buffers();
}

void Trainer::fill_batch(int64_t step,
                         int64_t micro,
                         const core::Tensor& inputs,
                         const core::Tensor& targets,
                         nn::VisionBatch* images) const {
    const auto& t = cfg_.train;
    if (image_batches()) {  // rows, not sequences, are the samples; the images come with them
        nn::VisionBatch scratch;
        const int64_t first_row =
            data::sampler_first_sample(data_step(step), t.grad_accum, micro, data_size(), data_rank(), t.batch_size);
        if (mix_)
            mix_->fill(first_row, t.batch_size, inputs, targets, images != nullptr ? images : &scratch, nullptr);
        else if (image_train_)
            image_train_->fill(first_row, t.batch_size, inputs, targets, images != nullptr ? images : &scratch);
        else
            disk_train_->fill(first_row, t.batch_size, inputs, targets, images != nullptr ? images : &scratch);
        return;
    }
    if (stage_sampler_) {
        // The stream of a stage is indexed from its first step, so each stage's samples are (seed, stage, index).
        MT_CHECK(data::curriculum_stage_of_step(stage_first_step_, step) == stage_,
                 "fill_batch of step {} outside stage {}",
                 step,
                 stage_);
        // Dropped data windows (trainer_health.cpp) move the stage's stream on by their length.
        stage_sampler_->fill(
            data::sampler_first_sample(
                data_step(step) - stage_first_step(), t.grad_accum, micro, data_size(), data_rank(), t.batch_size),
            t.batch_size,
            inputs,
            targets);
        return;
    }
    train_sampler_->fill(
        data::sampler_first_sample(data_step(step), t.grad_accum, micro, data_size(), data_rank(), t.batch_size),
        t.batch_size,
        inputs,
        targets);
}

StepResult Trainer::train_step(const core::Tensor& inputs, const core::Tensor& targets) {
    const auto& t = cfg_.train;
    long_prepare_step();
    const core::Shape shape = {t.grad_accum, t.batch_size, seq_len_};
    MT_CHECK(inputs.shape() == shape && targets.shape() == shape && inputs.dtype() == core::DType::i32 &&
                 targets.dtype() == core::DType::i32,
             "train_step: inputs {} and targets {} must be i32 [grad_accum, batch_size, seq_len] = {}",
             core::shape_str(inputs.shape()),
             core::shape_str(targets.shape()),
             core::shape_str(shape));
    allocate_step_batches();
    step_inputs_.copy_from(inputs);
    step_targets_.copy_from(targets);
    step_images_.clear();  // the caller's batches are text only
    batches_step_ = step_;
    return train_step();
}

StepResult Trainer::train_step() {
    const auto start = std::chrono::steady_clock::now();
    StepResult r;
    memory_step_begin();
    r.lr = schedule_.at(step_);
    r.loss_scale = scaler_.scale();
    if (batches_step_ != step_) read_step_batches();  // step_status reads them ahead when the run loop calls it
    compute_gradients(r);
    // A non-finite step that is not an fp16 overflow (dynamic loss scaling skips those) is re-run once on the same
    // batch: a clean re-run was a transient fault (hardware), a second failure is the data's or the model's.
    auto finite = [](const StepResult& x) { return std::isfinite(x.loss) && std::isfinite(x.grad_norm); };
    const bool overflow_case = scaler_.dynamic() && std::isfinite(r.loss);
    if (!finite(r) && !overflow_case && cfg_.health.spike_action != "off") {
        model_->moe_step_discard();
        StepResult again;
        again.lr = r.lr;
        again.loss_scale = r.loss_scale;
        compute_gradients(again);
        again.rerun = true;
        again.transient_fault = finite(again);
        transient_faults_total_ += again.transient_fault ? 1 : 0;
        r = std::move(again);
    }
    core::TraceRange range(model_->params().precision().device, "optimizer");
    if (async_writer_) async_writer_->before_state_update();  // a checkpoint's copies still running on the GPU
    observe_spikes(r);
    // A bad step under skip or rollback leaves the state as it was (trainer_health.cpp).
    if (!finite(r) && !overflow_case && handle_bad_step(r, "nonfinite")) return finish_step(r, start);
    if (r.loss_spike.spike && handle_bad_step(r, "loss_spike")) return finish_step(r, start);
    if (r.grad_spike.spike && handle_bad_step(r, "grad_spike")) return finish_step(r, start);
    // Under dynamic loss scaling an overflow skips the step (the step counter, schedule and data still advance, as
    // in Megatron-LM); anywhere else a non-finite value ends the run.
    r.skipped = !scaler_.update(finite(r)) && std::isfinite(r.loss) && scaler_.dynamic() && !scaler_.exhausted();
    if (!finite(r) && !r.skipped)
        core::fail_hint(
            core::ExitCode::health,
            nonfinite_hint(),
            "non-finite loss {} or gradient norm {} at step {}{}",
            r.loss,
            r.grad_norm,
            step_ + 1,
            scaler_.exhausted() ? fmt::format(" (loss scale already at its minimum {})", r.loss_scale) : "");
    // The per-layer gradient norms (from the norm's pass) are kept on the metrics steps only.
    const bool layer_stats = layer_stats_step();
    if (!layer_stats) r.layer_grad_sq.clear();
    param_sq_measured_ = false;
    if (!r.skipped) optimizer_step(r, layer_stats);
    mix_step_applied(r);
    if (layer_stats) {
        // The weight norms: from the update's own pass where it wrote them for every parameter, else a pass here.
        if (!param_sq_measured_)
            r.layer_param_sq =
                grad_sync_->group_norms_sq(layer_of_param_, nn::layer_stats_param_groups(cfg_.model), false);
        layer_stats_end(r);
    }
    ++step_;
    // The MoE balancers update from the routing the step's training forwards counted (the bias is not a gradient
    // quantity, so this happens also on a skipped step); the metrics and the collapse alarm come with it.
    // Every rank of the stage routes different tokens (under tp each tp rank its own rows).
    r.moe = model_->moe_step_end(step_, &mesh_->group(parallel::MeshGroup::stage));
    return finish_step(r, start);
}

StepResult& Trainer::finish_step(StepResult& r, std::chrono::steady_clock::time_point start) {
    memory_step_end(r);
    r.seconds = core::seconds_since(start);
    return r;
}

void Trainer::compute_gradients(StepResult& r) {
    const auto& t = cfg_.train;
    model_->params().zero_grads(/*skip_written_whole=*/true);  // the backward writes the weight matrices' whole
    model_->set_train_step(step_);
    grad_sync_->set_step(step_);  // compression's warm-up and random streams
    model_->reset_max_logits();   // the step's maxima start here (QK-clip, long/max_logit)
    layer_stats_begin();          // a re-run of the step starts the sums over
    beat_phase(Phase::data);
    // The loss is the mean cross-entropy over the supervised tokens of the whole global batch (long_context.md §5):
    // N_global, counted over every micro-batch and data rank before the first forward (the labels are known), and
    // every token's gradient is scaled by 1 / N_global, so a micro-batch with few supervised tokens weighs that
    // little (a mean of per-micro-batch means would not). Micro-batch m's mean loss gets the weight
    // w_m = counted_m A D / N_global (A micro-batches, D data ranks), exactly 1 when every micro-batch counts the
    // same tokens; each rank backpropagates w_m / (A D) of its mean, so the gradient reduction is a plain sum.
    int64_t local_supervised = 0;
    std::vector<int64_t> counted(static_cast<size_t>(t.grad_accum));
    for (int64_t micro = 0; micro < t.grad_accum; ++micro) {
        counted[static_cast<size_t>(micro)] = supervised_tokens(step_targets_.select(0, micro));
        local_supervised += counted[static_cast<size_t>(micro)];
    }
    const double n_global = dp_sum(static_cast<double>(local_supervised));
    const int64_t micro_divisor_int = t.grad_accum * data_size();
    const double micro_divisor = static_cast<double>(micro_divisor_int);
    std::vector<double> weights;
    for (int64_t micro = 0; micro < t.grad_accum; ++micro)
        weights.push_back(n_global > 0
                              ? static_cast<double>(counted[static_cast<size_t>(micro)] * micro_divisor_int) / n_global
                              : 0.0);
    if (mix_) mix_step_begin(n_global, r.loss_scale);
    if (pipelined()) {
        r.loss = pipeline_micro_batches(weights, r.loss_scale / micro_divisor, r);
        model_->params().settle_grads();  // after every chunk's backwards (Model::pass_backward leaves it to here)
        pipeline_reduce_tied_embedding();
    }
    // The last micro-batch's backward hands each bucket of complete gradients to the reduction as it goes.
    for (int64_t micro = 0; micro < t.grad_accum && !pipelined(); ++micro) {
        const double weight = weights[static_cast<size_t>(micro)];
        beat_phase(Phase::forward);
        if (model_->vision())
            model_->set_vision_batch(micro < std::ssize(step_images_) ? step_images_[micro] : nn::VisionBatch{});
        r.loss += (mix_ ? mix_micro_forward(micro)
                        : model_->forward(step_inputs_.select(0, micro), step_targets_.select(0, micro))) *
                  weight / static_cast<double>(t.grad_accum);
        r.aux_loss += model_->last_aux_loss() / static_cast<double>(t.grad_accum);
        const bool last = micro + 1 == t.grad_accum;
        if (last && grad_sync_->active())
            model_->set_grad_ready_hook([this](int first) { grad_sync_->grads_ready(first); });
        beat_phase(Phase::backward);
        model_->backward(r.loss_scale * weight / micro_divisor);
        model_->set_grad_ready_hook({});
    }
    if (fault_ && fault_->straggler_rank == mesh_->world().rank())  // tests: the others wait in the reduction
        std::this_thread::sleep_for(std::chrono::duration<double>(fault_->straggler_seconds));
    beat_phase(Phase::optimizer);  // the gradient reduction, the norm and the update
    r.comm_seconds = grad_sync_->finish(muon_stage_hook(r));
    reduce_kv_replicas();
    r.buckets_overlapped = grad_sync_->buckets_overlapped();
    r.loss = dp_sum(r.loss) / static_cast<double>(data_size());
    r.aux_loss = dp_sum(r.aux_loss) / static_cast<double>(data_size());
    if (mix_) mix_step_end(r);
    apply_fault(r);
    // The norm and the per-layer norms of the metrics (layer_stats) from one pass, on every step, so that the norm
    // (and the clip it drives) does not depend on which steps are metrics steps.
    // Under Muon every layer's group splits in two, its Muon matrices and the rest (norm_group_of_), so that the same
    // pass also gives the two optimizer groups' norms (muon.clip = "own_norm" and the metrics) without a pass of their
    // own.
    const int layers = nn::layer_stats_param_groups(cfg_.model);
    const parallel::GradSync::GradNorms norms = muon_ ? grad_sync_->grad_norms(norm_group_of_, 2 * (layers + 1))
                                                      : grad_sync_->grad_norms(layer_of_param_, layers);
    r.grad_norm = norms.norm / r.loss_scale;
    const double unscale = 1.0 / (r.loss_scale * r.loss_scale);
    if (muon_) {
        r.layer_grad_sq.assign(static_cast<size_t>(layers), 0.0);
        double group_sq[2] = {0.0, 0.0};  // AdamW's, Muon's
        for (int g = 0; g < 2 * (layers + 1); ++g) {
            const double sq = norms.group_sq[static_cast<size_t>(g)] * unscale;
            group_sq[g % 2] += sq;
            if (g / 2 < layers) r.layer_grad_sq[static_cast<size_t>(g / 2)] += sq;
        }
        r.optim.adamw_grad_norm = std::sqrt(group_sq[0]), r.optim.muon_grad_norm = std::sqrt(group_sq[1]);
    } else {
        r.layer_grad_sq = norms.group_sq;
        for (double& x : r.layer_grad_sq) x *= unscale;
    }
}

double Trainer::evaluate() {
    beat_phase(Phase::eval);
    if (mix_) return evaluate_mix();
    if (image_val_) return evaluate_images();
    if (disk_train_) return evaluate_disk_images();
    const auto& t = cfg_.train;
    const data::Sampler& sampler = val_sampler_ ? *val_sampler_ : *train_sampler_;
    // The data-parallel ranks share the batches round-robin; the sum over ranks is the single-process sum. Under
    // expert parallelism every forward is collective over the ep group, so all ranks run the same number of them:
    // a rank without a batch in the last round repeats batch 0 and does not count it.
    double sum = 0.0;
    const int64_t p = data_size(), rounds = (t.eval_batches + p - 1) / p;
    for (int64_t round = 0; round < rounds; ++round) {
        const int64_t b = round * p + data_rank();
        if (b >= t.eval_batches && mesh_->size(parallel::MeshAxis::ep) == 1) break;
        sampler.fill_sequential((b < t.eval_batches ? b : 0) * t.batch_size, t.batch_size, inputs_, targets_);
        const double loss = eval_forward({});  // text only
        if (b < t.eval_batches) sum += loss;
    }
    return dp_sum(sum) / static_cast<double>(t.eval_batches);
}

RunEnd Trainer::run() {
    const auto& t = cfg_.train;
    // Conventions §7: only world rank 0 writes files; the values it logs are already reduced over the ranks.
    const bool writer = mesh_->world().rank() == 0;
    if (writer) run_dir_prepare(cfg_.run.dir, cfg_.source);
    MetricsViews views;
    if (writer && cfg_.metrics.tensorboard) views.tensorboard_dir = cfg_.run.dir + "/tb";
    if (writer && cfg_.metrics.prometheus_file) views.prometheus_path = cfg_.run.dir + "/metrics.prom";
    views.job = cfg_.run.name;
    views.prometheus_per_expert = cfg_.metrics.prometheus_per_expert;
    metrics_ = std::make_unique<MetricsLog>(cfg_.metrics.jsonl && writer ? cfg_.run.dir + "/metrics.jsonl" : "", views);
    if (writer) endpoint_ = http_endpoint_start(cfg_, *metrics_, log_);
    const int64_t state_total = optimizer_state_bytes_total();
    // The model's parameters at their global shapes (an expert-parallel rank holds only its experts).
    int64_t n_params = 0;
    for (int i = 0; i < model_->params().size(); ++i)
        n_params += core::shape_numel(nn::param_global_shape(model_->params().spec(i)));
    metrics_->write(step_,
                    "config",
                    {{"config_toml", cfg_.to_toml()},
                     {"moetrain_version", MT_VERSION},
                     {"cuda", core::cuda_describe()},
                     {"threads", omp_get_max_threads()},
                     {"parameters", n_params},
                     {"mesh", mesh_->to_json()},
                     {"optimizer_state_bytes_per_rank", optimizer_state_bytes()},
                     {"optimizer_offload", adamw_->offloaded()},
                     {"optimizer_state_bytes_total", state_total},
                     {"zero_stage", grad_sync_->zero() ? 1 : 0},
                     {"checkpoint_reserve_seconds", checkpoint_reserve_seconds_}});
    if (!resumed_from_.empty())
        metrics_->write(step_,
                        "event",
                        {{"event", "resumed"},
                         {"checkpoint", resumed_from_},
                         {"load_seconds", resume_load_seconds_},
                         {"load_crc_seconds", resume_crc_seconds_},
                         {"load_check_seconds", resume_check_seconds_}});
    if (log_) {
        fmt::print(
            "moetrain: {} parameters, {} tokens per step, {} ({}, {} threads{}); train data {}\n",
            n_params,
            tokens_per_step(),
            core::device_name(model_->params().precision().device),
            core::dtype_name(model_->params().precision().compute),
            omp_get_max_threads(),
            mesh_->world().size() > 1
                ? fmt::format(" x {} processes, {}", mesh_->world().size(), parallel::mesh_describe(mesh_->shape()))
                : "",
            mix_            ? fmt::format("mixed sources {}", mix_->describe())
            : train_source_ ? train_source_->describe()
            : disk_train_
                ? fmt::format("{} image-caption samples ({})", disk_train_->dataset().size(), cfg_.data.format)
                : std::string("generated shapes image-caption samples"));
        if (adamw_->offloaded())
            fmt::print(
                "moetrain: optimizer offload: master weights and {} AdamW moments in host memory ({:.2f} GB); "
                "the update runs on the CPU\n",
                cfg_.optim.state_dtype,
                static_cast<double>(adamw_->state_bytes() + model_->params().master_arena().nbytes()) / 1e9);
        if (mesh_->world().size() > 1)
            fmt::print(
                "moetrain: optimizer state {:.2f} MB on this rank, {:.2f} MB for the whole model ({}, {} gradient "
                "buckets)\n",
                static_cast<double>(optimizer_state_bytes()) / 1e6,
                static_cast<double>(state_total) / 1e6,
                grad_sync_->zero() ? "ZeRO-1: sharded over the data-parallel ranks" : "replicated",
                grad_sync_->num_buckets());
        // Debian's OpenBLAS 0.3.21 falls back to slow generic kernels on CPUs it does not recognise.
        const std::string kernels = core::blas_kernel_name();
        if (kernels == "Prescott" || kernels == "Core2" || kernels == "Nehalem" || kernels == "generic")
            fmt::print(
                "moetrain: warning: OpenBLAS chose its '{}' kernels, which are several times slower than this "
                "CPU allows; set OPENBLAS_CORETYPE (e.g. SkylakeX, Haswell or Zen)\n",
                kernels);
    }
    long_prepare_step();
    check_validation_data();
    // Heartbeats (operations.md §1) while the loop runs: every rank's file, once rank 0 has prepared the run dir.
    struct StopBeats {
        std::unique_ptr<Heartbeat>& beats;
        ~StopBeats() {
            beats.reset();
        }
    } stop_beats{heartbeat_};
    if (cfg_.health.heartbeat_s > 0) {
        mesh_->world().barrier();
        heartbeat_ = std::make_unique<Heartbeat>(cfg_.run.dir, mesh_->world().rank(), step_, cfg_.health.heartbeat_s);
    }
    double elapsed = 0.0;
    int64_t timed_steps = 0, timed_tokens = 0;  // tokens: a curriculum changes the tokens of a step
    while (step_ < t.steps) {
        poll_checkpoint_write();
        if (const int64_t status = step_status(); status != 0) return stop_run(status);
        if (stage_started_) long_stage_start();
        comm_step_begin();
        const StepResult r = train_step();
        if (heartbeat_) heartbeat_->step_end(step_, r.seconds);
        if (!r.bad_step.empty() || r.health_stop) {  // nothing trained: the events say what happened
            handle_health_events(r);
            std::fflush(stdout);
            continue;
        }
        // The first step pays for allocation; leave it out of the rate once others exist.
        if (step_ > 1 || t.steps == 1) {
            elapsed += r.seconds;
            ++timed_steps;
            // Still the length of the step just done: the next stage is prepared when its batches are read.
            timed_tokens += tokens_per_step();
        }
        const double tok_s = timed_steps > 0 ? static_cast<double>(timed_tokens) / elapsed : 0.0;
        const double eta = timed_steps > 0 ? elapsed / timed_steps * static_cast<double>(t.steps - step_) : 0.0;
        std::string scale_note =
            scaler_.dynamic()
                ? fmt::format(" | loss scale {:g}{}", r.loss_scale, r.skipped ? " (overflow: skipped)" : "")
                : "";
        if (!r.moe.empty()) {
            scale_note += fmt::format(" | moe max_vio {:.3f}", moe_max_vio(r));
            if (cfg_.model.moe.balance.mode == nn::MoeBalanceMode::aux_loss)
                scale_note += fmt::format(" aux {:.4f}", r.aux_loss);
        }
        if (log_)
            fmt::print(
                "step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | "
                "{:.0f} tok/s | peak {:.1f} GB | ETA {}{}\n",
                step_,
                t.steps,
                r.loss,
                r.lr,
                r.grad_norm,
                tok_s,
                static_cast<double>(r.mem_peak) / 1e9,
                format_duration(eta),
                scale_note);
        if (step_ % cfg_.metrics.every == 0) {
            nlohmann::json fields = {{"loss", r.loss},
                                     {"lr", r.lr},
                                     {"grad_norm", r.grad_norm},
                                     {"tokens_per_s", tok_s},
                                     {"step_seconds", r.seconds},
                                     {"comm/dp_grad_seconds", r.comm_seconds},
                                     {"comm/dp_buckets_overlapped", r.buckets_overlapped},
                                     {"tokens_seen", tokens_seen(step_)}};
            if (pipelined()) {  // the ideal schedule's idle fraction and this rank's time (trainer_pipeline.cpp)
                fields["pp/bubble"] = r.pp_bubble;
                fields["pp/wait_seconds"] = r.pp_wait_seconds;
                fields["pp/compute_seconds"] = r.pp_compute_seconds;
                for (size_t s = 0; s < r.pp_stage_compute_seconds.size(); ++s) {  // per stage: pp/<stat>/s<stage>
                    const std::string stage = fmt::format("/s{}", s);
                    fields["pp/wait_seconds" + stage] = r.pp_stage_wait_seconds[s];
                    fields["pp/compute_seconds" + stage] = r.pp_stage_compute_seconds[s];
                    if (s < r.pp_stage_mem_peak.size()) fields["pp/mem_peak" + stage] = r.pp_stage_mem_peak[s];
                }
            }
            if (scaler_.dynamic()) {
                fields["loss_scale"] = r.loss_scale;
                fields["skipped"] = r.skipped;
                fields["skipped_total"] = scaler_.skipped();
            }
            add_memory_metrics(r, fields);
            add_moe_metrics(r, fields);
            add_long_metrics(fields);
            add_comm_metrics(fields);
            add_optim_metrics(r, fields);
            add_health_metrics(r, fields);
            add_alarm_metrics(fields);
            add_throughput_metrics(r, fields);
            add_mix_metrics(r, fields);
            metrics_->write(step_, "train", fields);
        }
        handle_health_events(r);
        handle_alarms(r);
        handle_memory_events(r);
        handle_moe_events(r);
        const bool last = step_ == t.steps;
        // The checkpoint first: a validation that fails then costs nothing since the step.
        if (cfg_.checkpoint.every_steps > 0 && (step_ % cfg_.checkpoint.every_steps == 0 || last))
            write_checkpoint(cfg_.checkpoint.async && !last);  // the last one is waited for anyway
        if (t.eval_every > 0 && (step_ % t.eval_every == 0 || last)) {
            const double val = evaluate();
            if (log_) fmt::print("step {:>6}/{} | val loss {:.4f}\n", step_, t.steps, val);
            metrics_->write(step_, "eval", eval_fields(val));
        }
        std::fflush(stdout);
    }
    finish_checkpoint_write();
    return RunEnd::completed;
}

}  // namespace mt::train
