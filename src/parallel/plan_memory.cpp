// The memory plan: the parameter state from the laid-out table (exact), the activations from plan_buffers.cpp, and
// the peak as the allocator would see it: everything held through the step plus the largest transient.
#include "parallel/plan_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

#include "nn/model.h"
#include "parallel/grad_sync.h"

namespace mt::parallel {

namespace {

// Requested bytes and the size-class bytes the CUDA allocator hands out for them (the same on the CPU).
struct Bytes {
    int64_t raw = 0, alloc = 0;
    Bytes& operator+=(const Bytes& o) {
        raw += o.raw, alloc += o.alloc;
        return *this;
    }
};

// The arenas as GradSync sees them (train/trainer.cpp grad_arenas, from the spec shapes: a laid-out table has no
// views).
std::vector<ArenaParam> arena_params(const nn::ParamTable& table) {
    std::vector<ArenaParam> params;
    for (int i = 0; i < table.size(); ++i)
        params.push_back({.begin = table.offset(i),
                          .numel = core::shape_numel(table.spec(i).shape),
                          .end = table.offset(i) + table.padded_numel(i),
                          .expert = nn::param_expert_sharded(table.spec(i)),
                          .tp_partial = table.spec(i).tp_partial_grad,
                          .tp_split = nn::param_tp_split(table.spec(i))});
    return params;
}

void plan_state(const MemoryPlanInput& in, MemoryPlan& plan) {
    const MeshShape& mesh = in.mesh;
    // Trainer: dp_span (cp x ep x dp) reduces the dense gradients, edp (cp x dp) the experts'; every parameter
    // starts at a multiple of both group sizes so that each bucket splits evenly.
    const int64_t span = mesh[MeshAxis::cp] * mesh[MeshAxis::ep] * mesh[MeshAxis::dp];
    const int64_t edp = mesh[MeshAxis::cp] * mesh[MeshAxis::dp];
    const int64_t stage = span * mesh[MeshAxis::tp];  // the tp-partial gradients' group
    nn::MoeExpertParallel ep;
    if (in.model.moe_enabled) ep = {.size = mesh[MeshAxis::ep] * mesh[MeshAxis::tp], .rank = 0};  // tp folded in
    const nn::TensorParallel tp{.size = mesh[MeshAxis::tp], .rank = 0};  // rank 0's shard (the largest: padding)
    const int64_t align = std::lcm(std::lcm(span, edp), stage);
    const nn::ParamTable table = nn::Model::param_layout(in.model, in.precision, align, ep, tp);
    plan.align = std::lcm(align, int64_t{64});  // ParamTable::layout's own minimum included
    for (int i = 0; i < table.size(); ++i) {
        plan.params_global += core::shape_numel(nn::param_global_shape(table.spec(i)));
        plan.params_rank += core::shape_numel(table.spec(i).shape);
    }
    plan.arena_numel = table.total_numel();
    const nn::Precision& p = in.precision;
    // Offload keeps a master copy in its own host arena even where the model trains in f32 (the weights are then
    // the forward's copy; nn::Precision::master_on_host), on a CPU run too. On a GPU that arena and the moments are
    // the host's memory, not the device's.
    plan.offload = in.offload && p.device == core::Device::cuda;
    plan.weights = table.arena_bytes(p.param);
    plan.master = p.has_master_copy() || in.offload ? table.arena_bytes(p.master) : 0;
    plan.grads = table.arena_bytes(p.master);
    // optim::AdamW: replicated, both moments over the whole arena; ZeRO-1, over the owned slice of every bucket
    // (1 / |group| of it, so every rank holds the same amount).
    plan.zero = in.zero_stage >= 1 && span > 1;
    plan.owned_numel = plan.arena_numel;
    if (span > 1) {
        const auto elem = static_cast<int64_t>(core::dtype_size(p.master));
        const std::vector<GradBucketRange> buckets = grad_sync_buckets(arena_params(table), elem, in.bucket_mb);
        plan.buckets = static_cast<int64_t>(buckets.size());
        if (plan.zero) {
            plan.owned_numel = 0;
            for (const GradBucketRange& b : buckets)
                plan.owned_numel += (b.end - b.begin) / (b.expert ? edp : b.tp_partial ? stage : span);
            plan.zero_staging = std::max<int64_t>(plan.owned_numel, 1) * elem;  // GradSync's staging_
        }
    }
    plan.optimizer = 2 * plan.owned_numel * static_cast<int64_t>(core::dtype_size(in.state_dtype));
}

class PeakSearch {
   public:
    explicit PeakSearch(bool cuda) : cuda_(cuda) {}
    Bytes of(int64_t bytes) const {
        return {bytes, cuda_ && bytes > 0 ? plan_cuda_size_class(bytes) : bytes};  // no buffer, no block
    }
    Bytes sum(const std::vector<PlanBuffer>& buffers, bool dropped, bool with_kept = true) const {
        Bytes b;
        for (const PlanBuffer& buf : buffers)
            if (buf.dropped == dropped && (with_kept || !buf.name.starts_with("kept."))) b += of(buf.bytes);
        return b;
    }
    // keys: the part of b that is key rows (a segment's dK, dV scratch and offload staging).
    void candidate(const Bytes& b, std::string where, const Bytes& keys = {}) {
        if (b.alloc <= best_.alloc) return;
        best_ = b;
        keys_ = keys;
        where_ = std::move(where);
    }
    const Bytes& best() const {
        return best_;
    }
    const Bytes& keys() const {
        return keys_;
    }
    const std::string& where() const {
        return where_;
    }

   private:
    bool cuda_;
    Bytes best_, keys_;
    std::string where_ = "none";
};

std::string mixer_name(const nn::ModelConfig& cfg, int64_t l, int sub) {
    if (sub == 0) return cfg.layer_is_kda(l) ? "kda" : "attention";
    return cfg.layer_is_moe(l) ? "moe" : "mlp";
}

// The key rows one segment's passes hold on the device beside the layers' activations (nn/layers/segment_kv.cpp,
// window_kv.cpp, AttentionLayer::segment_attention_backward), each a [B, rows, Hkv, D] allocation:
//   - every attention backward: its dK, dV over every key the segment sees;
//   - a global layer without offload: the K, V it reads, copied out of the cache when B > 1 (a view of one row);
//   - a global layer with long.offload_kv: staged rows. Its forward stages its K, V and the next global layer's,
//     releasing its own when done; its backward stages K, V, dK, dV, its own and the previous global layer's,
//     releasing its own when done. Under recompute full a group's re-run stages each of its global layers' K, V, dK,
//     dV (the backward phase does not release them) until that layer's backward;
//   - a window layer: the K, V it reads, assembled from its snapshot and its own (forward and backward), and in the
//     backward the snapshot rows' gradients it passes back.
class KeyRows {
   public:
    // tensor_bytes, prefix_bytes: per block, one tensor of the rows [lo, end of the segment) its attention reads and
    // of the rows [lo, first) before the segment (0: a KDA block).
    KeyRows(const PeakSearch& search,
            const nn::ModelConfig& cfg,
            std::vector<int64_t> tensor_bytes,
            std::vector<int64_t> prefix_bytes,
            bool offload,
            bool copies)
        : search_(search),
          bytes_(std::move(tensor_bytes)),
          prefix_(std::move(prefix_bytes)),
          offload_(offload),
          copies_(copies) {
        for (int64_t l = 0; l < static_cast<int64_t>(bytes_.size()); ++l) {
            window_.push_back(cfg.layer_is_window(l));
            if (!cfg.layer_is_kda(l) && !cfg.layer_is_window(l)) global_.push_back(l);
        }
    }
    bool attention(int64_t l) const {
        return l >= 0 && l < static_cast<int64_t>(bytes_.size()) && bytes_[static_cast<size_t>(l)] > 0;
    }
    // The key rows of block l's forward (backward = false) or backward beyond what is staged, staging as it does.
    Bytes pass(int64_t l, bool backward) {
        Bytes b;
        if (!attention(l)) return b;
        if (window_[static_cast<size_t>(l)]) {
            b += tensors(l, backward ? 4 : 2);
            if (backward) b += tensor(prefix_[static_cast<size_t>(l)]), b += tensor(prefix_[static_cast<size_t>(l)]);
            return b;
        }
        if (backward) b += tensors(l, 2);
        if (!offload_) {
            if (copies_) b += tensors(l, 2);
            return b;
        }
        stage(l, backward ? 4 : 2);
        stage(backward ? prev(l) : next(l), backward ? 4 : 2);
        return b;
    }
    // Recompute full's re-run of block l in the backward phase: a global layer stages its four tensors.
    void rerun(int64_t l) {
        if (attention(l) && !window_[static_cast<size_t>(l)]) stage(l, 4);
    }
    void release(int64_t l) {
        staged_.erase(l);
    }
    void clear() {
        staged_.clear();
    }
    Bytes staged() const {
        Bytes b;
        for (const auto& [l, copies] : staged_) b += tensors(l, copies);
        return b;
    }

   private:
    Bytes tensor(int64_t bytes) const {
        return bytes > 0 ? search_.of(bytes) : Bytes{};
    }
    Bytes tensors(int64_t l, int copies) const {
        Bytes b;
        for (int i = 0; i < copies; ++i) b += tensor(bytes_[static_cast<size_t>(l)]);
        return b;
    }
    int64_t next(int64_t l) const {
        for (int64_t g : global_)
            if (g > l) return g;
        return -1;
    }
    int64_t prev(int64_t l) const {
        for (auto it = global_.rbegin(); it != global_.rend(); ++it)
            if (*it < l) return *it;
        return -1;
    }
    void stage(int64_t l, int copies) {
        if (offload_ && attention(l)) staged_[l] = std::max(staged_[l], copies);
    }

    const PeakSearch& search_;
    std::vector<int64_t> bytes_, prefix_;
    bool offload_, copies_;
    std::vector<bool> window_;
    std::vector<int64_t> global_;    // the global attention blocks: offload's prefetch chain
    std::map<int64_t, int> staged_;  // block -> staged tensors
};

// The transient phases of one step: each sub-layer's forward and backward (the buffers its policy rebuilds and the
// op scratch inside), or under recompute full each block's forward and each group's re-run and backward. keys:
// with segments, what the segment's key rows add (null: none); prefix: names the segment.
void search_transients(const MemoryPlanInput& in,
                       const PlanActivations& a,
                       const PlanVision& vision,
                       PeakSearch& search,
                       KeyRows* keys,
                       const std::string& prefix) {
    const nn::ModelConfig& cfg = in.model;
    // The vision tower runs before the first layer's forward and after the last layer's backward (the splice).
    auto tower = [&](bool bwd) {
        Bytes t;
        for (const int64_t bytes : bwd ? vision.bwd_transient : vision.fwd_transient) t += search.of(bytes);
        if (t.raw > 0)
            search.candidate(t,
                             bwd ? "vision backward (the image slots' gradient rows, attention_bwd scratch)"
                                 : "vision forward (the pixels' copies)");
    };
    tower(false);
    const auto nb = static_cast<int64_t>(a.blocks.size());
    auto scratch = [&](const PlanSubLayer& s, bool bwd) { return search.of(bwd ? s.bwd_scratch : s.fwd_scratch); };
    auto attention = [&](int64_t l) { return keys != nullptr && keys->attention(l); };
    if (a.full_group > 0) {
        // A block's activations when it runs: both sub-layers' saved buffers and h (the first forward keeps no KDA
        // tiles; the re-run does), and its output unless the group keeps it anyway.
        auto block = [&](int64_t l, bool rerun) {
            const PlanBlock& b = a.blocks[static_cast<size_t>(l)];
            Bytes t = search.of(b.h.bytes);
            for (const PlanSubLayer& s : b.sub) t += search.sum(s.buffers, true, rerun);
            if (!b.keeps_output) t += search.of(b.out.bytes);
            return t;
        };
        for (int64_t l = 0; l < nb; ++l) {
            const PlanBlock& b = a.blocks[static_cast<size_t>(l)];
            Bytes t = block(l, false);
            if (l > 0 && !a.blocks[static_cast<size_t>(l - 1)].keeps_output) t += search.of(b.out.bytes);
            const Bytes s0 = scratch(b.sub[0], false), s1 = scratch(b.sub[1], false);
            t += s0.alloc >= s1.alloc ? s0 : s1;
            Bytes extra;
            if (keys != nullptr) extra = keys->pass(l, false), extra += keys->staged();
            t += extra;
            search.candidate(t, fmt::format("{}layer {} forward (recompute full)", prefix, l), extra);
            if (attention(l)) keys->release(l);
        }
        // The backward takes the groups from the last; each re-runs its blocks' forward, holding them all. The key
        // rows at block l's backward: the group's re-run layers not yet past their backward, the previous attention
        // layer's (staged by the backward after it) and l's own dK, dV.
        std::vector<Bytes> extra(static_cast<size_t>(nb));
        if (keys != nullptr) {
            keys->clear();
            for (int64_t first = (nb - 1) / a.full_group * a.full_group; first >= 0; first -= a.full_group) {
                const int64_t last = std::min(nb, first + a.full_group) - 1;
                for (int64_t l = first; l <= last; ++l) keys->rerun(l);
                for (int64_t l = last; l >= first; --l) {
                    Bytes e = keys->pass(l, true);
                    e += keys->staged();
                    extra[static_cast<size_t>(l)] = e;
                    keys->release(l);
                }
            }
        }
        for (int64_t first = (nb - 1) / a.full_group * a.full_group; first >= 0; first -= a.full_group) {
            const int64_t last = std::min(nb, first + a.full_group) - 1;
            Bytes group;
            for (int64_t l = first; l <= last; ++l) {
                group += block(l, true);
                const PlanBlock& b = a.blocks[static_cast<size_t>(l)];
                const Bytes s0 = scratch(b.sub[0], true), s1 = scratch(b.sub[1], true);
                Bytes t = group;
                t += s0.alloc >= s1.alloc ? s0 : s1;
                t += extra[static_cast<size_t>(l)];
                search.candidate(t,
                                 fmt::format("{}layer {} re-run and backward (recompute full, group of layers {}-{})",
                                             prefix,
                                             l,
                                             first,
                                             last),
                                 extra[static_cast<size_t>(l)]);
            }
        }
        tower(true);
        return;
    }
    // In the order they run (the first of equal phases is reported): the forward from layer 0, the backward back.
    for (int64_t step = 0; step < 4 * nb; ++step) {
        const bool bwd = step >= 2 * nb;
        const int64_t i = bwd ? 4 * nb - 1 - step : step, l = i / 2;
        const int sub = static_cast<int>(i % 2);
        const PlanSubLayer& s = a.blocks[static_cast<size_t>(l)].sub[static_cast<size_t>(sub)];
        // The first forward keeps no KDA tiles when the backward re-runs it; the re-run does.
        Bytes t = search.sum(s.buffers, true, bwd);
        if (a.attnres_mixed > 0) t += search.of(a.attnres_mixed);
        t += scratch(s, bwd);
        Bytes extra;
        const bool own = sub == 0 && attention(l);
        if (keys != nullptr) {
            if (step == 2 * nb) keys->clear();  // the forward released every layer's staging
            if (own) extra = keys->pass(l, bwd);
            extra += keys->staged();
            if (own) keys->release(l);
        }
        t += extra;
        const std::string& op = bwd ? s.bwd_scratch_op : s.fwd_scratch_op;
        search.candidate(t,
                         fmt::format("{}layer {} {} {}{}",
                                     prefix,
                                     l,
                                     mixer_name(cfg, l, sub),
                                     bwd ? "backward" : "forward",
                                     op.empty() ? "" : " (" + op + " scratch)"),
                         extra);
    }
    tower(true);
}

// Everything held from the end of one pass's forward into its backward, each buffer an allocation of its own: the
// activation lines, the workspace, communication and GEMM workspaces, and the state arenas on the device.
Bytes plan_held(const MemoryPlanInput& in,
                const PlanActivations& a,
                const PlanVision& vision,
                const PeakSearch& search,
                MemoryPlan& plan) {
    Bytes held;
    auto count = [&](const PlanBuffer& b, bool dropped) {
        MemoryActivations& line = plan.activations[static_cast<size_t>(b.kind)];
        if (dropped) {
            line.dropped += b.bytes;
            return;
        }
        (b.saved ? line.saved : line.held) += b.bytes;
        held += search.of(b.bytes);
    };
    for (const auto* list : {&a.model, &a.attnres, &vision.buffers})
        for (const PlanBuffer& b : *list) count(b, b.dropped);
    for (const PlanBlock& b : a.blocks) {
        for (const PlanSubLayer& s : b.sub)
            for (const PlanBuffer& buf : s.buffers) count(buf, buf.dropped);
        count(b.h, b.h.dropped);
        count(b.out, !b.keeps_output);
    }
    for (const MemoryActivations& line : plan.activations) {
        plan.saved_total += line.saved;
        plan.held_total += line.held;
    }
    for (const PlanBuffer& b : a.workspace) {
        plan.workspace += b.bytes;
        held += search.of(b.bytes);
    }
    plan.comm = plan.zero_staging;
    if (plan.zero_staging > 0) held += search.of(plan.zero_staging);
    for (const PlanBuffer& b : a.comm) {
        plan.comm += b.bytes;
        held += search.of(b.bytes);
    }
    // ops/cuda/gemm: cuBLASLt's workspaces, 32 MiB per lane for the linears and per stream (4) for the grouped
    // GEMMs, allocated at the first call and kept.
    if (in.precision.device == core::Device::cuda)
        plan.gemm_workspace = (2 + (in.model.n_moe_layers() > 0 ? 4 : 0)) * (int64_t{32} << 20);
    held += search.of(plan.gemm_workspace);
    for (int64_t arena : {plan.weights, plan.grads, plan.offload ? 0 : plan.master, plan.offload ? 0 : plan.optimizer})
        if (arena > 0) held += search.of(arena);
    return held;
}

// The segments to search: per segment length the last one of it (the one whose keys reach furthest).
std::vector<int64_t> peak_segments(const PlanSegments& segs) {
    std::map<int64_t, int64_t> last;
    for (int64_t j = 0; j < segs.count(); ++j) last[segs.length(j)] = j;
    std::vector<int64_t> out;
    for (const auto& [length, j] : last) out.push_back(j);
    std::sort(out.begin(), out.end());
    return out;
}

void plan_notes(const MemoryPlanInput& in, MemoryPlan& plan) {
    const bool cuda = in.precision.device == core::Device::cuda;
    auto note = [&](std::string text) { plan.notes.push_back(std::move(text)); };
    if (plan.vision_tokens > 0)
        note(fmt::format(
            "vision tower: planned for the most image tokens a micro-batch can hold, {} ({} patches): every row full "
            "of images of {} LM tokens ({} patches each, the largest vision.max_pixels or the shapes canvas allows), "
            "each with the fewest other tokens of its sample ({}). Real batches hold fewer; the tower's buffers keep "
            "the size of the largest batch seen. Under pipeline parallelism the tower is the first stage's",
            plan.vision_tokens,
            plan.vision_patches,
            in.image_tokens,
            4 * in.image_tokens,
            in.image_frame_tokens));
    else if (in.model.vision.enabled())
        note("vision.layers > 0 but the data holds no images: the vision tower's activations are not counted");
    if (cuda && in.model.n_kda_layers() > 0 && in.model.document_mask && in.model.kda.save != nn::KdaSave::none)
        note(fmt::format(
            "kda.save = \"{}\" under document masking: the KDA op keeps its tensors at the packed rows' length "
            "(each document padded to whole chunks of {}); they are counted at the unpacked length, so rows of many "
            "short documents keep more (up to 16x, beyond which the op splits the documents and keeps nothing)",
            nn::enum_name(in.model.kda.save),
            in.model.kda.chunk_size));
    if (in.mesh[MeshAxis::ep] > 1)
        note(
            "expert parallelism: the expert-side rows assume balanced routing (N top_k rows arrive per rank); the "
            "layers' buffers grow by half again whenever more arrive");
    if (in.offload && !cuda)
        note(
            "optim.offload = \"cpu\" on a CPU run: the state is host memory already; the master weights are an arena "
            "of their own beside the weights the forward reads");
    if (plan.offload)
        note(
            "optim.offload = \"cpu\": the master weights (the whole arena, in f32) and the AdamW moments are host "
            "memory; the offload's pinned staging buffers (two chunks of up to 16M elements of f32 gradients and of "
            "the "
            "weights, optim/adamw.h) are not counted");
    const MemorySegments& seg = plan.segments;
    if (seg.count > 1) {
        note(fmt::format(
            "sequence segments: the activations, workspace and transient are those of segment {} of {} ({} tokens "
            "per row), where the peak falls; the attention caches and KDA's kept states cover the whole row. Not "
            "counted: the host copies of the row's ids and targets (8 B T bytes), document masking's maps, and the "
            "moment a resize between segments of different lengths holds one buffer at both sizes",
            seg.peak_index + 1,
            seg.count,
            seg.peak_length));
        if (seg.offload)
            note(
                "long.offload_kv: the key/value caches, the dK/dV accumulators and KDA's kept states and halos are "
                "pinned host memory; the device stages the key rows [lo, end of the segment) of at most two "
                "attention layers at a time (more under recompute full with several attention layers per group), "
                "inside the largest transient");
    }
    if (cuda) {
        note(
            "outside the allocator, so not in the peak: the CUDA context, cuBLAS handles and NCCL's own buffers "
            "(roughly 0.5-1 GB per process)");
        note(
            "not modelled: the few-MB partial sums of the RMSNorm, conv, gate and AttnRes parameter gradients, the "
            "RoPE tables and the MoE plan's counters (transient, far below the largest op scratch)");
    } else {
        note(
            "CPU: the figures are the tensors; the process's resident set adds the program, OpenMP and OpenBLAS "
            "buffers and the CPU ops' own scratch, which are not modelled");
    }
}

}  // namespace

int64_t plan_cuda_size_class(int64_t bytes) {
    const int64_t quantum = bytes < (int64_t{1} << 20) ? 512 : (int64_t{2} << 20);
    const int64_t b = bytes == 0 ? 1 : bytes;
    return (b + quantum - 1) / quantum * quantum;
}

MemoryPlan plan_memory(const MemoryPlanInput& in) {
    MemoryPlan base;
    base.input = in;
    plan_state(in, base);
    const bool cuda = in.precision.device == core::Device::cuda;
    const PeakSearch sizes(cuda);
    // What crosses the segment boundaries: on the device (a CPU run's memory is its device) or the host.
    const PlanSegments segs = plan_segments(in.model, in.precision, in.batch, in.seq);
    MemorySegments& seg = base.segments;
    seg.count = segs.count();
    seg.longest = segs.longest();
    seg.offload = segs.offload;
    seg.buffers = segs.held;
    Bytes seg_held;
    for (const PlanSegmentBuffer& b : segs.held) {
        const bool host = cuda && b.where != SegmentWhere::device;
        (host ? seg.host : seg.device) += b.bytes();
        if (host) continue;
        const Bytes one = sizes.of(b.each);
        seg_held += {one.raw * b.count, one.alloc * b.count};
    }
    // The peak over the segments' passes (one pass without segments): each segment's activations held, its phases'
    // transients above them.
    MemoryPlan best;
    best.peak = -1;
    const int64_t head_dim = in.model.resolved_head_dim();
    // The vision tower, for the most image slots a micro-batch can hold (image batches run without segments).
    const int64_t slots =
        in.model.vision.enabled() ? plan_image_slots(in.batch, in.seq, in.image_tokens, in.image_frame_tokens) : 0;
    const PlanVision vision =
        slots > 0 ? plan_vision(in.model, in.precision, 4 * slots, in.deterministic) : PlanVision{};
    base.vision_tokens = vision.tokens;
    base.vision_patches = vision.patches;
    for (int64_t j : peak_segments(segs)) {
        MemoryPlan plan = base;
        const PlanActivations a = plan_segment_activations(
            in.model, in.precision, in.batch, segs, j, in.mesh[MeshAxis::ep], in.deterministic);
        PeakSearch search(cuda);
        Bytes held = plan_held(in, a, vision, search, plan);
        held += seg_held;
        std::optional<KeyRows> keys;
        std::string prefix;
        if (segs.count() > 1) {
            const int64_t row = in.batch * in.model.n_kv_heads * head_dim *
                                static_cast<int64_t>(core::dtype_size(in.precision.compute));
            std::vector<int64_t> tensor = plan_segment_key_rows(in.model, segs, j), before = tensor;
            for (size_t l = 0; l < tensor.size(); ++l) {
                before[l] = tensor[l] > 0 ? (tensor[l] - segs.length(j)) * row : 0;
                tensor[l] *= row;
            }
            keys.emplace(search, in.model, std::move(tensor), std::move(before), segs.offload, in.batch > 1);
            prefix = fmt::format("segment {} of {} ({} tokens), ", j + 1, segs.count(), segs.length(j));
        }
        search_transients(in, a, vision, search, keys ? &*keys : nullptr, prefix);
        plan.transient = search.best().alloc;
        plan.transient_at = search.where();
        plan.peak = held.alloc + search.best().alloc;
        plan.rounding = plan.peak - held.raw - search.best().raw;
        plan.segments.peak_index = j;
        plan.segments.peak_length = segs.length(j);
        plan.segments.transient_keys = search.keys().alloc;
        if (plan.peak > best.peak) best = std::move(plan);
    }
    plan_notes(in, best);
    return best;
}

}  // namespace mt::parallel
