// Trainer <-> the mesh: which parallel layouts this trainer runs, and the reductions of per-rank values over the
// ranks that read different data (the gradients themselves: parallel/grad_sync.h).
#include <fmt/format.h>

#include <algorithm>

#include "core/backend.h"
#include "parallel/comm_nccl.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::check_parallel_layout() const {
    const parallel::MeshShape& s = mesh_->shape();
    if (s.world() == 1) return;
    const bool cuda =
        cfg_.run.device == "cuda" || (cfg_.run.device == "auto" && core::backend_available(core::Device::cuda));
    if (!cuda) return;
    if (s[parallel::MeshAxis::cp] > 1)
        core::fail_hint(core::ExitCode::usage,
                        "set run.device = \"cpu\", or parallel.cp = 1 (docs/distributed.md \"Context parallelism\")",
                        "parallel.cp = {} runs on the CPU only yet: its collectives move host tensors over MPI [{}]",
                        s[parallel::MeshAxis::cp],
                        cfg_.source);
    if (!parallel::comm_nccl_compiled())
        core::fail_hint(core::ExitCode::usage,
                        "set run.device = \"cpu\", or rebuild with NCCL (docs/distributed.md)",
                        "{} on the GPU needs the NCCL backend, which this build does not have [{}]",
                        parallel::mesh_describe(s),
                        cfg_.source);
}

// The model's arenas as the gradient synchronisation sees them: ranges and reduction groups, no model types.
// tied_copy: the parameter that is one of two copies of a tied embedding (pipeline parallelism), or -1.
// whole_matrices: the Muon group's stacks are owned matrix by matrix (muon.md §3; under ZeRO-1).
parallel::GradArenas trainer_grad_arenas(const nn::ParamTable& table, int tied_copy, bool whole_matrices) {
    parallel::GradArenas arenas{.params = {},
                                .grads = table.grad_arena(),
                                .weights = table.param_arena(),
                                .master = table.master_arena(),
                                .master_copy = table.precision().has_master_copy()};
    for (int i = 0; i < table.size(); ++i)
        arenas.params.push_back({.begin = table.offset(i),
                                 .numel = table.grad(i).numel(),
                                 .end = table.offset(i) + table.padded_numel(i),
                                 .expert = nn::param_expert_sharded(table.spec(i)),
                                 .tp_partial = table.spec(i).tp_partial_grad,
                                 .tp_split = nn::param_tp_split(table.spec(i)),
                                 .pipeline_tied = i == tied_copy,
                                 .tp_replicas = table.spec(i).tp_replicas});
    for (int i = 0; i < table.size() && whole_matrices; ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (spec.group != nn::OptimGroup::muon) continue;
        const size_t n = spec.shape.size();
        arenas.params[static_cast<size_t>(i)].matrix_rows = spec.shape[n - 2];
        arenas.params[static_cast<size_t>(i)].matrix_cols = spec.shape[n - 1];
    }
    return arenas;
}

ops::MuonHyper trainer_muon_hyper(const JobConfig& cfg) {
    const MuonConfig& m = cfg.muon;
    return {.lr = cfg.train.lr,
            .momentum = m.momentum,
            .nesterov = m.nesterov,
            .ns_steps = static_cast<int>(m.ns_steps),
            .hybrid = m.ns_coeffs == "hybrid",
            .scale_factor = m.scale_factor,
            .weight_decay = m.weight_decay};
}

void Trainer::check_muon_layout() const {
    // The compression codecs are CPU code (parallel/compressed_reduce.h).
    if (model_->params().precision().device != core::Device::cpu && cfg_.compress.level > 0)
        core::fail_hint(core::ExitCode::usage,
                        "set compress.level = 0, or run.device = \"cpu\" (docs/optimizers.md)",
                        "compress.level = {} compresses host gradients only yet: the codecs run on the CPU [{}]",
                        cfg_.compress.level,
                        cfg_.source);
}

std::unique_ptr<optim::Muon> Trainer::make_muon() const {
    optim::MuonOptions options{.tp = model_->tensor_parallel(), .per_head = cfg_.muon.per_head};
    // The overlap (muon.md §3): each gradient bucket's matrices are a phase of their own, stepped as it lands.
    if (grad_sync_->active()) options.phase_of_param = grad_sync_->bucket_of_params();
    if (!grad_sync_->owns_matrices())
        return std::make_unique<optim::Muon>(model_->params(), trainer_muon_hyper(cfg_), std::move(options));
    // Whole-matrix ownership (muon.md §3): this rank's matrices, and the balance every rank computed alike.
    options.owned.emplace();
    std::vector<optim::MuonMatrixRef>& owned = *options.owned;
    for (const parallel::OwnedMatrix& m : grad_sync_->owned_matrices())
        owned.push_back({.param = m.param, .index = m.index, .writer = m.writer});
    const parallel::OwnershipReport& report = grad_sync_->ownership_report();
    if (log_) {
        auto balance = [](const std::vector<double>& cost) {
            if (cost.empty()) return std::string("-");
            const auto [lo, hi] = std::minmax_element(cost.begin(), cost.end());
            return fmt::format(
                "{} owners, Newton-Schulz GFLOP per iteration {:.3f} to {:.3f}", cost.size(), *lo / 1e9, *hi / 1e9);
        };
        int64_t payload = 0, padding = 0;
        for (const auto& b : report.buckets) payload += b.payload, padding += b.padding;
        fmt::print("muon ownership: dense {}; experts {}; {} packed buckets, padding {:.1f}%\n",
                   balance(report.dense_cost),
                   balance(report.expert_cost),
                   report.buckets.size(),
                   payload > 0 ? 100.0 * static_cast<double>(padding) / static_cast<double>(payload) : 0.0);
        for (size_t k = 0; k < report.buckets.size(); ++k) {
            const auto& b = report.buckets[k];
            if (static_cast<double>(b.padding) > 0.1 * static_cast<double>(b.payload))
                fmt::print(
                    "moetrain: warning: muon ownership: bucket {} ({} matrices{}) pads {} elements to its {}: "
                    "more than 10% (muon.bucket_mb larger packs more matrices per bucket)\n",
                    k,
                    b.matrices,
                    b.expert ? ", experts" : "",
                    b.padding,
                    b.payload);
        }
    }
    return std::make_unique<optim::Muon>(model_->params(), trainer_muon_hyper(cfg_), std::move(options));
}

int64_t Trainer::optimizer_state_bytes_total() const {
    // Both moments of every parameter at its global shape, as a replicated optimizer without expert parallelism
    // allocates them (each parameter padded to the arena alignment; an expert tensor's ep shards each padded).
    const nn::ParamTable& table = model_->params();
    int64_t n = 0;
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (nn::param_tp_split(spec))  // a tp shard: the whole tensor (one process would add its arena padding)
            n += core::shape_numel(nn::param_global_shape(spec));
        else
            n += table.padded_numel(i) * (nn::param_expert_sharded(spec) ? spec.shard_global / spec.shape[0] : 1);
    }
    return 2 * n * static_cast<int64_t>(core::dtype_size(config_state_dtype(cfg_, table.precision().master)));
}

nn::Model& Trainer::model() {
    grad_sync_->settle_params();
    return *model_;
}

double Trainer::dp_sum(double value) {
    if (data_size() == 1) return value;
    // The cp ranks of a data rank hold the same value (their rows' loss, supervised tokens): one of them adds it.
    const double mine = mesh_->coord(parallel::MeshAxis::cp) == 0 ? value : 0.0;
    return parallel::comm_all_reduce_sum(mesh_->group(parallel::MeshGroup::dp_span), mine);
}

}  // namespace mt::train

namespace mt::train {

void Trainer::reduce_kv_replicas() {
    if (!kv_replicas_) return;
    const nn::ParamTable& table = model_->params();
    for (int i = 0; i < table.size(); ++i) {
        if (table.spec(i).tp_replicas <= 1) continue;
        parallel::comm_all_reduce_through_host(*kv_replicas_, table.grad(i));  // a few [D, C] heads
    }
}

}  // namespace mt::train
