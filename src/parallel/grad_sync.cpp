// Bucketed gradient reduction, overlapped with the backward, and the ZeRO-1 scatter/gather.
#include "parallel/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "core/clock.h"
#include "ops/global_norm.h"

namespace mt::parallel {

std::vector<GradBucketRange> grad_sync_buckets(const std::vector<ArenaParam>& params,
                                               int64_t elem_bytes,
                                               const BucketLimits& limits) {
    auto elements = [&](double mb) { return std::max<int64_t>(1, static_cast<int64_t>(mb * 1048576.0) / elem_bytes); };
    const int64_t limit = elements(limits.bucket_mb), muon_limit = elements(limits.muon_bucket_mb);
    std::vector<GradBucketRange> buckets;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0;) {
        GradBucketRange b;
        b.expert = params[i].expert;
        b.tp_partial = params[i].tp_partial && !b.expert;
        b.end = params[i].end;
        const int64_t min_matrices = b.expert ? limits.min_matrices_expert : limits.min_matrices_dense;
        // Whole parameters, the same reduction group, up to the size limit (a larger parameter is a bucket of its
        // own); one holding whole-owned matrices up to the Muon limit and on until it has min_matrices of them.
        int j = i;
        int64_t matrices = 0;
        auto same_group = [&](const ArenaParam& p) {
            return p.expert == b.expert && (p.tp_partial && !p.expert) == b.tp_partial;
        };
        auto room = [&](const ArenaParam& p) {
            if ((matrices > 0 || p.matrix_rows > 0) && matrices < min_matrices) return true;
            return b.end - p.begin <= (matrices > 0 || p.matrix_rows > 0 ? muon_limit : limit);
        };
        while (j >= 0 && same_group(params[j]) && (j == i || room(params[j]))) {
            if (params[j].matrix_rows > 0)
                matrices += params[j].numel / (params[j].matrix_rows * params[j].matrix_cols);
            --j;
        }
        b.lowest = j + 1;
        b.begin = params[b.lowest].begin;
        buckets.push_back(b);
        i = j;
    }
    return buckets;
}

namespace {

// A packed bucket's block: the arena ranges `block`, back to back in `buffer` from element `at`. to_buffer copies the
// arena's elements into the buffer (packing), otherwise the buffer's into the arena (unpacking).
void copy_block(const std::vector<optim::ArenaRange>& block,
                const core::Tensor& arena,
                const core::Tensor& buffer,
                int64_t at,
                bool to_buffer) {
    for (const optim::ArenaRange& range : block) {
        const core::Tensor a = arena.slice(0, range.begin, range.end);
        const core::Tensor b = buffer.slice(0, at, at + range.end - range.begin);
        (to_buffer ? b : a).copy_from(to_buffer ? a : b);
        at += range.end - range.begin;
    }
}

// The squared norms of parts keyed by K (a list of tensors each), in the map's order, from one norm call: one device
// synchronisation for all of them.
template <typename K>
std::vector<std::pair<K, double>> norms_sq_by_key(const std::map<K, std::vector<core::Tensor>>& parts) {
    std::vector<core::Tensor> all;
    std::vector<int> group;
    std::vector<K> keys;
    for (const auto& [key, tensors] : parts) {
        all.insert(all.end(), tensors.begin(), tensors.end());
        group.insert(group.end(), tensors.size(), static_cast<int>(keys.size()));
        keys.push_back(key);
    }
    const std::vector<double> sq = ops::global_norms_sq(all, group, static_cast<int>(keys.size()));
    std::vector<std::pair<K, double>> out;
    for (size_t k = 0; k < keys.size(); ++k) out.emplace_back(keys[k], sq[k]);
    return out;
}

}  // namespace

GradSync::GradSync(GradArenas arenas,
                   const Mesh& mesh,
                   const GradSyncOptions& options,
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
      zero_(options.zero && mesh.group(MeshGroup::dp_span).size() > 1),
      // With tensor parallelism alone the tp-partial gradients still need their sum over tp.
      active_(mesh.group(MeshGroup::stage).size() > 1),
      poison_gathers_(options.poison_gathers) {
    owns_matrices_ = zero_ && std::any_of(arenas_.params.begin(), arenas_.params.end(), [](const ArenaParam& p) {
                         return p.matrix_rows > 0;
                     });
    if (!active_) {
        owned_.push_back({0, arenas_.grads.numel()});
        owned_flat_ = owned_;
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
    BucketLimits limits{.bucket_mb = options.bucket_mb, .muon_bucket_mb = options.muon_bucket_mb};
    if (owns_matrices_) {
        limits.min_matrices_dense = 2 * dense_rows_->size();
        limits.min_matrices_expert = 2 * edp_rows_->size();
    }
    for (const GradBucketRange& range : grad_sync_buckets(arenas_.params, elem, limits)) {
        Bucket b;
        b.lowest = range.lowest;
        b.begin = range.begin;
        b.end = range.end;
        b.expert = range.expert;
        b.tp_partial = range.tp_partial;
        buckets_.push_back(std::move(b));
    }
    if (owns_matrices_) plan_packed(options);
    for (Bucket& b : buckets_) {
        if (!b.blocks.empty()) continue;  // packed
        const int64_t p = group(b).size();
        MT_CHECK((b.end - b.begin) % p == 0,
                 "grad sync: bucket of {} elements does not split over {} ranks (parameter alignment)",
                 b.end - b.begin,
                 p);
        b.share = (b.end - b.begin) / p;
        b.mine = b.begin + group(b).rank() * b.share;
        b.held.push_back({b.mine, b.mine + b.share, zero_ ? p : 1});
        owned_.push_back({b.mine, b.mine + b.share});
        owned_flat_.push_back({b.mine, b.mine + b.share});
    }
    auto by_begin = [](const auto& a, const auto& b) { return a.begin < b.begin; };
    std::sort(owned_.begin(), owned_.end(), by_begin);
    std::sort(owned_flat_.begin(), owned_flat_.end(), by_begin);
    if (!zero_) return;
    int64_t staged = 0;
    for (Bucket& b : buckets_) {
        b.staging = staged;
        staged += b.share;
    }
    staging_ = core::Tensor::zeros({std::max<int64_t>(staged, 1)}, grads.dtype(), grads.device());
}

void GradSync::plan_packed(const GradSyncOptions& options) {
    OwnerLoad dense_load, expert_load;
    for (Bucket& b : buckets_) {
        int end = b.lowest;  // the bucket's parameters: [lowest, end)
        while (end < static_cast<int>(arenas_.params.size()) && arenas_.params[end].begin < b.end) ++end;
        bool matrices = false;
        for (int i = b.lowest; i < end; ++i) matrices = matrices || arenas_.params[i].matrix_rows > 0;
        if (!matrices) continue;
        MT_CHECK(!b.tp_partial, "grad sync: whole-owned matrices in a tp-partial bucket");
        Comm& comm = group(b);
        const int64_t ranks = comm.size();
        b.positions = options.max_owner_group > 0 ? std::min(ranks, options.max_owner_group) : ranks;
        const PackedBucket packed =
            plan_packed_bucket(arenas_.params, b.lowest, end, ranks, b.positions, b.expert ? expert_load : dense_load);
        b.blocks = packed.blocks;
        b.share = packed.shard;
        const auto me = static_cast<size_t>(comm.rank());
        for (const optim::ArenaRange& r : packed.flat[me]) {
            b.held.push_back({r.begin, r.end, ranks});
            owned_flat_.push_back(r);
        }
        for (const OwnedMatrix& m : packed.matrices) {
            if (m.owner != comm.rank() % b.positions) continue;
            b.held.push_back({m.begin, m.begin + m.numel, b.positions});
            owned_matrices_.push_back(m);
            owned_matrices_.back().writer = comm.rank() < b.positions;
        }
        for (const optim::ArenaRange& r : b.blocks[me]) owned_.push_back(r);
        if (options.compress.level > 0 && ranks > 1) {
            b.compress = std::make_shared<CompressedReduce>(
                options.compress, packed.flat, packed.owned, comm.rank(), static_cast<int64_t>(&b - buckets_.data()));
            compress_warmup_ = options.compress_warmup_steps;
        }
        report_.buckets.push_back({.expert = b.expert,
                                   .matrices = static_cast<int64_t>(packed.matrices.size()),
                                   .payload = packed.payload,
                                   .padding = packed.padding});
    }
    report_.dense_cost = dense_load.cost;
    report_.expert_cost = expert_load.cost;
    std::sort(owned_matrices_.begin(), owned_matrices_.end(), [](const OwnedMatrix& a, const OwnedMatrix& b) {
        return a.param != b.param ? a.param < b.param : a.index < b.index;
    });
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
    b.compressed = b.compress != nullptr && compressing();
    if (b.compressed) {
        b.work = b.compress->start(comm, grads, step_);
        return;
    }
    if (!b.blocks.empty()) {
        // Packed: every rank's block of this rank's gradients, padded with zeros, then one reduce-scatter.
        b.send = core::Tensor::zeros({comm.size() * b.share}, grads.dtype(), grads.device());
        for (size_t r = 0; r < b.blocks.size(); ++r)
            copy_block(b.blocks[r], grads, b.send, static_cast<int64_t>(r) * b.share, true);
        base = static_cast<char*>(b.send.raw());
    }
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

std::vector<int> GradSync::bucket_of_params() const {
    std::vector<int> out(arenas_.params.size(), -1);
    for (size_t i = 0; i < arenas_.params.size(); ++i)
        for (size_t k = 0; k < buckets_.size(); ++k)
            if (arenas_.params[i].begin >= buckets_[k].begin && arenas_.params[i].begin < buckets_[k].end)
                out[i] = static_cast<int>(k);
    return out;
}

double GradSync::finish(const std::function<void(int bucket)>& on_reduced) {
    if (!active_) return 0.0;
    const auto start = std::chrono::steady_clock::now();
    double in_callback = 0.0;
    auto reduced = [&](const Bucket& b) {
        if (!on_reduced) return;
        const auto t = std::chrono::steady_clock::now();
        on_reduced(static_cast<int>(&b - buckets_.data()));
        in_callback += core::seconds_since(t);
    };
    overlapped_ = issued_early_;
    issued_early_ = 0;
    for (Bucket& b : buckets_)
        if (!b.issued) issue(b);
    const core::Tensor& grads = arenas_.grads;
    for (Bucket& b : buckets_) {
        b.work.wait();
        b.issued = false;
        // The owned slice's reduced gradient goes back to its place in the arena, where the optimizer reads it.
        if (!zero_ || group(b).size() == 1) {
        } else if (b.compressed) {
            b.compress->finish(grads);
        } else if (b.blocks.empty()) {
            grads.slice(0, b.mine, b.mine + b.share).copy_from(staging_.slice(0, b.staging, b.staging + b.share));
        } else {
            copy_block(b.blocks[static_cast<size_t>(group(b).rank())], grads, staging_, b.staging, false);
            b.send = core::Tensor();
        }
        reduced(b);
    }
    return core::seconds_since(start) - in_callback;
}

double GradSync::copies(const ArenaParam& p, int64_t group) const {
    // An expert's tensors are held by its edp group (the experts are spread over the other ranks of the stage, tp x
    // ep); every other parameter by every rank of the stage but for a tp split. A ZeRO-1 owned slice is one rank's of
    // its group.
    const int64_t holders =
        (p.expert ? edp_size_ : stage_size_ / (p.tp_split ? tp_size_ : 1) * p.tp_replicas) * (p.pipeline_tied ? 2 : 1);
    return static_cast<double>(holders / (zero_ ? group : 1));
}

// The parts of an arena that this rank holds, keyed by (group, multiplicity): each rank adds what it holds divided by
// the number of ranks holding the same elements, and the sum over the job counts every element once. Under ZeRO-1 a
// rank holds its owned slice of each bucket (the slices partition the bucket over its group); with a replicated
// optimizer every parameter. A parameter of group -1 joins group `groups` where `ungrouped` (the total counts it,
// no group does), else is left out.
std::map<std::pair<int, double>, std::vector<core::Tensor>> GradSync::held_parts(const core::Tensor& arena,
                                                                                 const std::vector<int>& group_of,
                                                                                 int groups,
                                                                                 bool ungrouped) const {
    std::map<std::pair<int, double>, std::vector<core::Tensor>> parts;
    auto add = [&](size_t i, int64_t begin, int64_t end, int64_t group) {
        const ArenaParam& p = arenas_.params[i];
        begin = std::max(begin, p.begin), end = std::min(end, p.begin + p.numel);
        const int g = group_of[i] < 0 ? groups : group_of[i];
        if (g == groups && !ungrouped) return;
        if (begin < end) parts[{g, world_->size() == 1 ? 1.0 : copies(p, group)}].push_back(arena.slice(0, begin, end));
    };
    if (!active_ || !zero_) {
        for (size_t i = 0; i < arenas_.params.size(); ++i)
            add(i, arenas_.params[i].begin, arenas_.params[i].begin + arenas_.params[i].numel, 1);
    } else {
        for (const Bucket& b : buckets_)
            for (size_t i = 0; i < arenas_.params.size(); ++i)
                if (arenas_.params[i].begin < b.end && arenas_.params[i].end > b.begin)
                    for (const Bucket::Held& h : b.held) add(i, h.begin, h.end, h.group);
    }
    return parts;
}

GradSync::GradNorms GradSync::grad_norms(const std::vector<int>& group_of, int groups) const {
    MT_CHECK(group_of.size() == arenas_.params.size(),
             "grad_norms: {} groups for {} parameters",
             group_of.size(),
             arenas_.params.size());
    // One pass (one device synchronisation) for the groups and the total; the total's last entry, one all-reduce.
    std::vector<double> sq(static_cast<size_t>(groups) + 1, 0.0);
    for (const auto& [key, part_sq] : norms_sq_by_key(held_parts(arenas_.grads, group_of, groups, true))) {
        if (key.first < groups) sq[static_cast<size_t>(key.first)] += part_sq / key.second;
        sq.back() += part_sq / key.second;
    }
    if (world_->size() > 1) world_->all_reduce(sq.data(), groups + 1, CommType::f64, ReduceOp::sum).wait();
    GradNorms out;
    out.norm = std::sqrt(sq.back());
    out.group_sq.assign(sq.begin(), sq.end() - 1);
    return out;
}

std::vector<double> GradSync::group_norms_sq(const std::vector<int>& group_of, int groups, bool grads) const {
    MT_CHECK(group_of.size() == arenas_.params.size(),
             "group_norms_sq: {} groups for {} parameters",
             group_of.size(),
             arenas_.params.size());
    // As grad_norms: each part weighed by the ranks holding the same elements, one norm call for all of them.
    std::vector<double> sq(static_cast<size_t>(groups), 0.0);
    for (const auto& [key, part_sq] :
         norms_sq_by_key(held_parts(grads ? arenas_.grads : arenas_.master, group_of, groups, false)))
        if (key.first < groups) sq[static_cast<size_t>(key.first)] += part_sq / key.second;
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
                if (p.begin >= b.begin && p.begin < b.end)
                    members = !b.blocks.empty() && p.matrix_rows > 0 ? b.positions : group(b).size();
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
    if (poison_gathers_) poison_unowned(arena);
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) b->param_gather = start_gather(*b, arena);
    if (mixed) master_stale_ = true;
}

CompressReport GradSync::compress_report() const {
    CompressReport out;
    if (!compressing()) return out;
    for (const Bucket& b : buckets_) {
        if (!b.compress) continue;
        out.stats += b.compress->stats();
        out.wire_bytes += b.compress->wire_bytes();
        out.raw_bytes += b.compress->raw_bytes();
    }
    return out;
}

std::vector<CompressedReduce::State> GradSync::compress_states() {
    std::vector<CompressedReduce::State> out;
    for (Bucket& b : buckets_)
        if (b.compress)
            for (CompressedReduce::State& s : b.compress->states()) out.push_back(std::move(s));
    return out;
}

void GradSync::reset_compress_states() {
    for (Bucket& b : buckets_)
        if (b.compress) b.compress->reset_states();
}

void GradSync::poison_unowned(const core::Tensor& arena) const {
    // The real elements of every gathered bucket's parameters outside this rank's own ranges (owned_ is sorted);
    // the alignment padding between parameters is left alone (a packed gather does not carry it).
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const Bucket& b : buckets_) {
        if (group(b).size() == 1) continue;
        for (const ArenaParam& p : arenas_.params) {
            if (p.begin < b.begin || p.begin >= b.end) continue;
            int64_t at = p.begin;
            const int64_t end = p.begin + p.numel;
            for (const optim::ArenaRange& r : owned_) {
                if (r.end <= at || r.begin >= end) continue;
                if (r.begin > at) arena.slice(0, at, r.begin).fill(nan);
                at = std::max(at, r.end);
            }
            if (at < end) arena.slice(0, at, end).fill(nan);
        }
    }
}

void GradSync::params_needed(int end) {
    for (Bucket& b : buckets_)
        if (b.lowest < end) {
            b.param_gather.wait_on_device();
            unpack_gathered(b);
        }
}

void GradSync::settle_params() {
    for (Bucket& b : buckets_) {
        b.param_gather.wait();
        unpack_gathered(b);
    }
}

void GradSync::gather_master() {
    settle_params();
    if (!master_stale_) return;
    for (Bucket& b : buckets_) b.param_gather = start_gather(b, arenas_.master);
    settle_params();
    master_stale_ = false;
}

CommWork GradSync::start_gather(Bucket& b, const core::Tensor& arena) {
    Comm& comm = group(b);
    if (comm.size() == 1) return {};
    // A gather only moves data, so it goes as bytes: any dtype, any backend.
    const auto elem = static_cast<int64_t>(core::dtype_size(arena.dtype()));
    if (b.blocks.empty()) {
        char* base = static_cast<char*>(arena.raw());
        return comm.all_gather(base + b.mine * elem, base + b.begin * elem, b.share * elem, CommType::u8);
    }
    // Packed: this rank's block out of the arena into its place in the gather buffer, gathered in place; the other
    // blocks go back into the arena once the gather completes (unpack_gathered).
    b.gathered = core::Tensor::scratch({comm.size() * b.share}, arena.dtype(), arena.device());
    b.gather_arena = arena;
    copy_block(b.blocks[static_cast<size_t>(comm.rank())], arena, b.gathered, comm.rank() * b.share, true);
    char* base = static_cast<char*>(b.gathered.raw());
    return comm.all_gather(base + comm.rank() * b.share * elem, base, b.share * elem, CommType::u8);
}

void GradSync::unpack_gathered(Bucket& b) {
    if (!b.gather_arena.defined()) return;
    const int me = group(b).rank();
    for (size_t r = 0; r < b.blocks.size(); ++r) {
        // With capped owner positions several ranks hold the same matrices: their blocks land on the same ranges.
        if (static_cast<int>(r) == me) continue;
        copy_block(b.blocks[r], b.gather_arena, b.gathered, static_cast<int64_t>(r) * b.share, false);
    }
    b.gathered = core::Tensor();
    b.gather_arena = core::Tensor();
}

}  // namespace mt::parallel
