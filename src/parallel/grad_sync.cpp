// Bucketed gradient reduction, overlapped with the backward, and the ZeRO-1 scatter/gather.
#include "parallel/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "ops/global_norm.h"

namespace mt::parallel {

std::vector<GradBucketRange> grad_sync_buckets(const std::vector<ArenaParam>& params,
                                               int64_t elem_bytes,
                                               double bucket_mb) {
    const int64_t limit = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1048576.0) / elem_bytes);
    std::vector<GradBucketRange> buckets;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0;) {
        GradBucketRange b;
        b.expert = params[i].expert;
        b.tp_partial = params[i].tp_partial && !b.expert;
        b.end = params[i].end;
        // Whole parameters, the same reduction group, up to the size limit (a larger parameter is its own bucket).
        int j = i;
        auto same_group = [&](const ArenaParam& p) {
            return p.expert == b.expert && (p.tp_partial && !p.expert) == b.tp_partial;
        };
        while (j >= 0 && same_group(params[j]) && (j == i || b.end - params[j].begin <= limit)) --j;
        b.lowest = j + 1;
        b.begin = params[b.lowest].begin;
        buckets.push_back(b);
        i = j;
    }
    return buckets;
}

GradSync::GradSync(GradArenas arenas,
                   const Mesh& mesh,
                   double bucket_mb,
                   bool zero,
                   Comm* dense_rows,
                   Comm* expert_rows,
                   Comm* stage_rows)
    : arenas_(std::move(arenas)),
      dense_(&mesh.group(MeshGroup::dp_span)),
      world_(&mesh.world()),
      dense_rows_(dense_rows != nullptr ? dense_rows : &mesh.group(MeshGroup::dp_span)),
      edp_rows_(expert_rows != nullptr ? expert_rows : &mesh.group(MeshGroup::edp)),
      stage_rows_(stage_rows != nullptr ? stage_rows : &mesh.group(MeshGroup::stage)),
      tp_size_(mesh.size(MeshAxis::tp)),
      edp_size_(mesh.group(MeshGroup::edp).size()),
      stage_size_(mesh.group(MeshGroup::stage).size()),
      zero_(zero && mesh.group(MeshGroup::dp_span).size() > 1),
      // With tensor parallelism alone the tp-partial gradients still need their sum over tp.
      active_(mesh.group(MeshGroup::stage).size() > 1) {
    if (!active_) {
        owned_.push_back({0, arenas_.grads.numel()});
        return;
    }
    const core::Tensor& grads = arenas_.grads;
    // GPU gradients need communicators that move device memory (NCCL); the MPI backend reads host memory only.
    if (grads.device() == core::Device::cuda)
        for (const Comm* c : {dense_rows_, edp_rows_, stage_rows_})
            MT_CHECK(c->size() == 1 || c->backend() == "nccl",
                     "grad sync: GPU gradients over the {} backend (the buckets need NCCL communicators)",
                     c->backend());
    const auto elem = static_cast<int64_t>(core::dtype_size(grads.dtype()));
    for (const GradBucketRange& range : grad_sync_buckets(arenas_.params, elem, bucket_mb)) {
        Bucket b;
        b.lowest = range.lowest;
        b.begin = range.begin;
        b.end = range.end;
        b.expert = range.expert;
        b.tp_partial = range.tp_partial;
        const int64_t p = group(b).size();
        MT_CHECK((b.end - b.begin) % p == 0,
                 "grad sync: bucket of {} elements does not split over {} ranks (parameter alignment)",
                 b.end - b.begin,
                 p);
        b.share = (b.end - b.begin) / p;
        b.mine = b.begin + group(b).rank() * b.share;
        owned_.push_back({b.mine, b.mine + b.share});
        buckets_.push_back(std::move(b));
    }
    std::sort(owned_.begin(), owned_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    if (!zero_) return;
    int64_t staged = 0;
    for (Bucket& b : buckets_) {
        b.staging = staged;
        staged += b.share;
    }
    staging_ = core::Tensor::zeros({std::max<int64_t>(staged, 1)}, grads.dtype(), grads.device());
}

void GradSync::issue(Bucket& b) {
    b.issued = true;
    Comm& comm = group(b);
    if (comm.size() == 1) return;  // experts held by this rank alone: nothing to reduce
    const core::Tensor& grads = arenas_.grads;
    const CommType type = comm_type_of(grads.dtype());
    const size_t elem = core::dtype_size(grads.dtype());
    char* base = static_cast<char*>(grads.raw()) + static_cast<size_t>(b.begin) * elem;
    if (!zero_) {
        b.work = comm.all_reduce(base, b.end - b.begin, type, ReduceOp::sum);
        return;
    }
    char* out = static_cast<char*>(staging_.raw()) + static_cast<size_t>(b.staging) * elem;
    b.work = comm.reduce_scatter(base, out, b.share, type, ReduceOp::sum);
}

void GradSync::grads_ready(int first) {
    for (Bucket& b : buckets_) {
        if (!b.issued && b.lowest >= first) {
            issue(b);
            // The hook's final call (first = 0) comes after the whole backward: not overlapped.
            if (first > 0) ++issued_early_;
        }
        if (b.issued) (void)b.work.done();
    }
}

double GradSync::finish() {
    if (!active_) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    overlapped_ = issued_early_;
    issued_early_ = 0;
    for (Bucket& b : buckets_)
        if (!b.issued) issue(b);
    const core::Tensor& grads = arenas_.grads;
    for (Bucket& b : buckets_) {
        b.work.wait();
        b.issued = false;
        if (!zero_ || group(b).size() == 1) continue;
        // The owned slice's reduced gradient goes back to its place in the arena, where the optimizer reads it.
        grads.slice(0, b.mine, b.mine + b.share).copy_from(staging_.slice(0, b.staging, b.staging + b.share));
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double GradSync::copies(const ArenaParam& p, int64_t group) const {
    // An expert's tensors are held by its edp group (the experts are spread over the other ranks of the stage, tp x
    // ep); every other parameter by every rank of the stage but for a tp split. A ZeRO-1 owned slice is one rank's of
    // its group.
    const int64_t holders =
        (p.expert ? edp_size_ : stage_size_ / (p.tp_split ? tp_size_ : 1) * p.tp_replicas) * (p.pipeline_tied ? 2 : 1);
    return static_cast<double>(holders / (zero_ ? group : 1));
}

double GradSync::grad_norm() const {
    const core::Tensor& grads = arenas_.grads;
    if (world_->size() == 1) return ops::global_norm({grads});
    // Squared norms of parts of equal multiplicity, one norm call per multiplicity (one device synchronisation each):
    // each rank adds what it holds divided by the number of ranks holding the same elements, and the sum over the
    // job counts every element once. Under ZeRO-1 a rank holds its owned slice of each bucket (the slices partition
    // the bucket over its group); with a replicated optimizer every parameter.
    std::map<double, std::vector<core::Tensor>> parts;
    auto add = [&](const ArenaParam& p, int64_t begin, int64_t end, int64_t group) {
        begin = std::max(begin, p.begin), end = std::min(end, p.begin + p.numel);
        if (begin < end) parts[copies(p, group)].push_back(grads.slice(0, begin, end));
    };
    if (!active_ || !zero_) {
        for (const ArenaParam& p : arenas_.params) add(p, p.begin, p.begin + p.numel, 1);
    } else {
        for (const Bucket& b : buckets_)
            for (const ArenaParam& p : arenas_.params)
                if (p.begin < b.end && p.end > b.begin) add(p, b.mine, b.mine + b.share, group(b).size());
    }
    double local = 0.0;
    for (const auto& [n, tensors] : parts) {
        const double norm = ops::global_norm(tensors);
        local += norm * norm / n;
    }
    return std::sqrt(comm_all_reduce_sum(*world_, local));
}

std::vector<double> GradSync::group_norms_sq(const std::vector<int>& group_of, int groups, bool grads) const {
    const core::Tensor& arena = grads ? arenas_.grads : arenas_.master;
    MT_CHECK(group_of.size() == arenas_.params.size(),
             "group_norms_sq: {} groups for {} parameters",
             group_of.size(),
             arenas_.params.size());
    // As grad_norm: each part weighed by the ranks holding the same elements, one norm call per (group, multiplicity).
    std::map<std::pair<int, double>, std::vector<core::Tensor>> parts;
    auto add = [&](size_t i, int64_t begin, int64_t end, int64_t group) {
        const ArenaParam& p = arenas_.params[i];
        begin = std::max(begin, p.begin), end = std::min(end, p.begin + p.numel);
        if (group_of[i] >= 0 && begin < end)
            parts[{group_of[i], world_->size() == 1 ? 1.0 : copies(p, group)}].push_back(arena.slice(0, begin, end));
    };
    if (!active_ || !zero_) {
        for (size_t i = 0; i < arenas_.params.size(); ++i)
            add(i, arenas_.params[i].begin, arenas_.params[i].begin + arenas_.params[i].numel, 1);
    } else {
        for (const Bucket& b : buckets_)
            for (size_t i = 0; i < arenas_.params.size(); ++i)
                if (arenas_.params[i].begin < b.end && arenas_.params[i].end > b.begin)
                    add(i, b.mine, b.mine + b.share, group(b).size());
    }
    std::vector<double> sq(static_cast<size_t>(groups), 0.0);
    for (const auto& [key, tensors] : parts) {
        const double norm = ops::global_norm(tensors);
        sq[static_cast<size_t>(key.first)] += norm * norm / key.second;
    }
    if (world_->size() > 1) world_->all_reduce(sq.data(), groups, CommType::f64, ReduceOp::sum).wait();
    return sq;
}

std::vector<double> GradSync::group_sums(const std::vector<double>& per_param,
                                         const std::vector<int>& group_of,
                                         int groups) const {
    MT_CHECK(per_param.size() == arenas_.params.size() && group_of.size() == arenas_.params.size(),
             "group_sums: {} values and {} groups for {} parameters",
             per_param.size(),
             group_of.size(),
             arenas_.params.size());
    std::vector<double> out(static_cast<size_t>(groups), 0.0);
    for (size_t i = 0; i < arenas_.params.size(); ++i) {
        if (group_of[i] < 0) continue;
        const ArenaParam& p = arenas_.params[i];
        int64_t members = 1;  // a replicated optimizer: each rank updates the whole parameter
        if (active_ && zero_)
            for (const Bucket& b : buckets_)
                if (p.begin >= b.begin && p.begin < b.end) members = group(b).size();
        out[static_cast<size_t>(group_of[i])] += world_->size() == 1 ? per_param[i] : per_param[i] / copies(p, members);
    }
    return out;
}

void GradSync::gather_params() {
    if (!zero_) return;
    // The arena the forward reads, updated by the optimizer in the owned slices only. Under mixed precision that is
    // the bf16 copy, and the f32 master weights stay sharded as in Megatron-LM's distributed optimizer: the
    // optimizer reads only its own slices of them, so they are gathered (gather_master) only when a whole copy is
    // read, for a checkpoint. That moves a third of the bytes of gathering both (2 per element instead of 6).
    const bool mixed = arenas_.master_copy;
    // In forward order (the embedding first), so the first blocks' parameters arrive first; the next forward waits
    // for each bucket just before it reads it (params_needed), on the GPU where the backend allows.
    const core::Tensor& arena = mixed ? arenas_.weights : arenas_.master;
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) b->param_gather = start_gather(*b, arena);
    if (mixed) master_stale_ = true;
}

void GradSync::params_needed(int end) {
    for (Bucket& b : buckets_)
        if (b.lowest < end) b.param_gather.wait_on_device();
}

void GradSync::settle_params() {
    for (Bucket& b : buckets_) b.param_gather.wait();
}

void GradSync::gather_master() {
    settle_params();
    if (!master_stale_) return;
    std::vector<CommWork> works;
    for (const Bucket& b : buckets_) works.push_back(start_gather(b, arenas_.master));
    for (auto& w : works) w.wait();
    master_stale_ = false;
}

CommWork GradSync::start_gather(const Bucket& b, const core::Tensor& arena) {
    Comm& comm = group(b);
    if (comm.size() == 1) return {};
    // A gather only moves data, so it goes as bytes: any dtype, any backend.
    const auto elem = static_cast<int64_t>(core::dtype_size(arena.dtype()));
    char* base = static_cast<char*>(arena.raw());
    return comm.all_gather(base + b.mine * elem, base + b.begin * elem, b.share * elem, CommType::u8);
}

}  // namespace mt::parallel
