// Trainer <-> the mesh: which parallel layouts this trainer runs, and data parallelism's reductions (gradients in
// buckets, scalar metrics). Every replica ends a step with the same reduced gradients, so the replicated optimizer
// steps keep the weights identical without a broadcast.
#include <algorithm>
#include <chrono>

#include "core/backend.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::check_parallel_layout() const {
    const dist::MeshShape& s = mesh_->shape();
    auto unsupported = [&](const char* key, int64_t value, const char* what) {
        core::fail_hint(core::ExitCode::usage,
                        fmt::format("set {} = 1; data parallelism (parallel.dp) is what this version runs", key),
                        "{} = {}: {} is not implemented yet [{}]",
                        key,
                        value,
                        what,
                        cfg_.source);
    };
    if (s[dist::MeshAxis::tp] > 1) unsupported("parallel.tp", s[dist::MeshAxis::tp], "tensor parallelism");
    if (s[dist::MeshAxis::cp] > 1) unsupported("parallel.cp", s[dist::MeshAxis::cp], "context parallelism");
    if (s[dist::MeshAxis::pp] > 1) unsupported("parallel.pp", s[dist::MeshAxis::pp], "pipeline parallelism");
    if (s[dist::MeshAxis::ep] > 1) unsupported("parallel.ep", s[dist::MeshAxis::ep], "expert parallelism");
    if (s[dist::MeshAxis::dp] == 1) return;
    // The MoE layers count routing per rank; under dp their histograms, loads and metrics must be summed over the
    // ranks (moe.md §3) before the balancer update and the collapse alarm (whose "stop" must be one decision for
    // all ranks), and the layers do not expose that reduction yet.
    if (cfg_.model.moe_enabled)
        core::fail_hint(core::ExitCode::usage,
                        "train MoE models in one process (parallel.dp = 1) for now",
                        "moe.enabled = true with parallel.dp = {}: reducing the MoE routing counts over data-parallel "
                        "ranks is not implemented yet [{}]",
                        s[dist::MeshAxis::dp],
                        cfg_.source);
    if (cfg_.run.device == "cuda" || (cfg_.run.device == "auto" && core::backend_available(core::Device::cuda)))
        core::fail_hint(core::ExitCode::usage,
                        "set run.device = \"cpu\" for multi-process runs until the NCCL backend lands",
                        "parallel.dp = {} on the GPU needs the NCCL backend, which is not implemented yet [{}]",
                        s[dist::MeshAxis::dp],
                        cfg_.source);
}

double Trainer::reduce_gradients() {
    if (dp_size() == 1) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    dist::Comm& comm = mesh_->group(dist::MeshGroup::dp);
    const core::Tensor grads = model_->params().grad_arena();
    const dist::CommType type = dist::comm_type_of(grads.dtype());
    const int64_t elem = static_cast<int64_t>(core::dtype_size(grads.dtype()));
    const int64_t n = grads.numel();
    const int64_t bucket = std::max<int64_t>(1, static_cast<int64_t>(cfg_.parallel.bucket_mb * 1048576.0) / elem);
    // Every bucket is issued before the first wait, so MPI pipelines them; the sum is elementwise, so the result
    // does not depend on the bucket size. Issuing each bucket while backward still runs needs a hook in the model's
    // backward; until then the reduction follows the last micro-batch's backward.
    auto* base = static_cast<char*>(grads.raw());
    std::vector<dist::CommWork> works;
    for (int64_t begin = 0; begin < n; begin += bucket)
        works.push_back(comm.all_reduce(base + begin * elem, std::min(bucket, n - begin), type, dist::ReduceOp::sum));
    for (auto& w : works) w.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Trainer::dp_sum(double value) {
    if (dp_size() == 1) return value;
    return dist::comm_all_reduce_sum(mesh_->group(dist::MeshGroup::dp), value);
}

}  // namespace mt::train
