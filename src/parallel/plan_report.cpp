// The memory plan as one JSON object (`moetrain plan --memory --json`) and as the human-readable table.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "parallel/plan_memory.h"

namespace mt::parallel {

namespace {

double gb(int64_t bytes) {
    return static_cast<double>(bytes) / 1e9;
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t v) {
    std::string digits = std::to_string(v < 0 ? -v : v), out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return v < 0 ? "-" + out : out;
}

// text as lines of at most `width` characters, the first after `first`, the others after `rest`.
std::string wrapped(const std::string& text, const std::string& first, const std::string& rest, size_t width) {
    std::string out, line = first;
    bool empty = true;  // no word on `line` yet
    std::istringstream words(text);
    for (std::string word; words >> word;) {
        if (!empty && line.size() + 1 + word.size() > width) {
            out += line + "\n";
            line = rest;
            empty = true;
        }
        line += (empty ? "" : " ") + word;
        empty = false;
    }
    return out + line + "\n";
}

std::string recompute_text(const nn::RecomputeConfig& r) {
    std::string text(nn::enum_name(r.policy));
    if (r.policy == nn::RecomputePolicy::selective) {
        std::vector<std::string> names;
        for (nn::RecomputeModule m : r.modules) names.emplace_back(nn::enum_name(m));
        text += fmt::format(" [{}]", fmt::join(names, ", "));
    }
    if (r.policy == nn::RecomputePolicy::full)
        text += r.every > 0 ? fmt::format(", every {}", r.every) : std::string(", every sqrt");
    return text;
}

// How many instances a kind's line sums over, and what they are.
std::pair<int64_t, const char*> instances(const nn::ModelConfig& cfg, PlanKind kind) {
    const int64_t kda = cfg.n_kda_layers(), moe = cfg.n_moe_layers();
    switch (kind) {
        case PlanKind::attention:
            return {cfg.n_layers - kda, "layers"};
        case PlanKind::kda:
            return {kda, "layers"};
        case PlanKind::mlp:
            return {cfg.n_layers - moe, "layers"};
        case PlanKind::moe:
            return {moe, "layers"};
        case PlanKind::norm:
            return {2 * cfg.n_layers, "pre-norms"};
        case PlanKind::residual:
            return {cfg.n_layers, "blocks: h, out"};
        case PlanKind::attnres:
            return {cfg.attnres.enabled() ? 2 * cfg.n_layers + 1 : 0, "mixes"};
        case PlanKind::embed_head:
            return {1, "embedding, final norm, logits, loss"};
        case PlanKind::grad_buffers:
            return {1, cfg.attnres.enabled() ? "gradient buffers (residual stream, AttnRes)" : "gradient buffers"};
        case PlanKind::vision:
            return {cfg.vision.enabled() ? cfg.vision.layers : 0, "ViT blocks, projector"};
    }
    return {0, ""};
}

// The report's line of a segment buffer (buffers of one line add up).
std::string segment_label(const PlanSegmentBuffer& b, const nn::ModelConfig& cfg, int64_t segments) {
    const int64_t kda = cfg.n_kda_layers(), window = cfg.n_window_layers(), attn = cfg.n_layers - kda - window;
    if (b.name == "attention.kv_cache") return fmt::format("attention K, V of the whole row ({} layers)", attn);
    if (b.name == "attention.kv_grads") return fmt::format("attention dK, dV accumulators ({} layers)", attn);
    if (b.name.starts_with("attention.window_snapshots"))
        return fmt::format("window K, V snapshots ({} layers x {})", window, segments - 1);
    if (b.name == "attention.window_snapshot_copies") return "window snapshots' device copies";
    if (b.name == "attention.window_grads") return "window snapshot gradients (backward)";
    if (b.name == "kda.kept_states") return fmt::format("kda kept start states ({} layers x {})", kda, segments - 1);
    if (b.name == "kda.carried_states") return "kda final, carried and passed-back states";
    if (b.name == "kda.ds0") return "kda start-state gradients (backward)";
    if (b.name.starts_with("kda.kept_halos"))
        return fmt::format("kda kept conv halos ({} layers x {} x 3)", kda, segments - 1);
    if (b.name.starts_with("kda.carried_halos")) return "kda carried conv halos";
    if (b.name == "losses") return "per-token losses of the row";
    return b.name;
}

std::string_view where_name(SegmentWhere where) {
    switch (where) {
        case SegmentWhere::device:
            return "device";
        case SegmentWhere::pinned:
            return "pinned";
        case SegmentWhere::host:
            return "host";
    }
    return "";
}

std::string precision_text(const nn::Precision& p) {
    if (p.device == core::Device::cpu) return fmt::format("cpu {}", core::dtype_name(p.compute));
    if (!p.has_master_copy()) return fmt::format("cuda {}", core::dtype_name(p.compute));
    return fmt::format("cuda {} mixed (f32 master weights and gradients)", core::dtype_name(p.compute));
}

}  // namespace

nlohmann::json memory_plan_json(const MemoryPlan& plan) {
    const MemoryPlanInput& in = plan.input;
    nlohmann::json mesh = nlohmann::json::object();
    for (auto [axis, name] : {std::pair{MeshAxis::tp, "tp"},
                              {MeshAxis::cp, "cp"},
                              {MeshAxis::ep, "ep"},
                              {MeshAxis::dp, "dp"},
                              {MeshAxis::pp, "pp"}})
        mesh[name] = in.mesh[axis];
    mesh["world"] = in.mesh.world();
    nlohmann::json acts = nlohmann::json::object();
    for (int k = 0; k < kPlanKinds; ++k) {
        const auto kind = static_cast<PlanKind>(k);
        const MemoryActivations& a = plan.activations[static_cast<size_t>(k)];
        acts[std::string(plan_kind_name(kind))] = {{"instances", instances(in.model, kind).first},
                                                   {"saved", a.saved},
                                                   {"held", a.held},
                                                   {"dropped", a.dropped}};
    }
    const nn::Precision& p = in.precision;
    const MemorySegments& seg = plan.segments;
    nlohmann::json seg_buffers = nlohmann::json::array();
    for (const PlanSegmentBuffer& b : seg.buffers)
        seg_buffers.push_back({{"name", b.name},
                               {"bytes", b.bytes()},
                               {"allocations", b.count},
                               {"where", std::string(where_name(b.where))},
                               {"backward_only", b.backward_only}});
    return {
        {"config", in.source},
        {"device", std::string(core::device_name(p.device))},
        {"precision",
         {{"compute", core::dtype_name(p.compute)},
          {"param", core::dtype_name(p.param)},
          {"master", core::dtype_name(p.master)},
          {"stats", core::dtype_name(p.stats)}}},
        {"batch", in.batch},
        {"seq", in.seq},
        {"tokens", in.batch * in.seq},
        {"vision", {{"image_tokens", plan.vision_tokens}, {"patches", plan.vision_patches}}},
        {"segments",
         {{"count", seg.count},
          {"longest", seg.longest},
          {"peak_segment", seg.peak_index + 1},
          {"peak_segment_tokens", seg.peak_length},
          {"offload_kv", seg.offload},
          {"device_bytes", seg.device},
          {"host_bytes", seg.host},
          {"buffers", seg_buffers}}},
        {"mesh", mesh},
        {"zero", plan.zero},
        {"gradient_buckets", plan.buckets},
        {"recompute", recompute_text(in.model.recompute)},
        {"params", {{"global", plan.params_global}, {"rank", plan.params_rank}, {"arena_numel", plan.arena_numel}}},
        {"param_align", plan.align},
        {"state",
         {{"weights", plan.weights},
          {"gradients", plan.grads},
          {"master", plan.master},
          {"optimizer", plan.optimizer},
          {"optimizer_dtype", core::dtype_name(in.state_dtype)},
          {"optimizer_numel", plan.owned_numel},
          {"offload", plan.offload},
          {"device", plan.state_device()},
          {"host", plan.state_host()},
          {"state_bytes", plan.state_bytes()}}},
        {"activations", acts},
        {"saved_activation_bytes", plan.saved_total},
        {"held_bytes", plan.held_total},
        {"workspace_bytes", plan.workspace},
        {"comm_bytes", plan.comm},
        {"gemm_workspace_bytes", plan.gemm_workspace},
        {"transient", {{"bytes", plan.transient}, {"at", plan.transient_at}, {"key_rows_bytes", seg.transient_keys}}},
        {"rounding_bytes", plan.rounding},
        {"peak_device_bytes", plan.peak},
        {"peak_activation_bytes", plan.peak - plan.state_device()},
        {"host_bytes", plan.host_peak()},
        {"notes", plan.notes}};
}

std::string memory_plan_table(const MemoryPlan& plan) {
    const MemoryPlanInput& in = plan.input;
    const nn::ModelConfig& cfg = in.model;
    std::string out = fmt::format("moetrain plan --memory: {} (one rank; GB = 1e9 bytes)\n", in.source);
    out += fmt::format("  model      {} parameters (this rank {}), an arena of {} elements, offsets aligned to {}\n",
                       grouped(plan.params_global),
                       grouped(plan.params_rank),
                       grouped(plan.arena_numel),
                       plan.align);
    const MemorySegments& seg = plan.segments;
    out += fmt::format("  batch      {} x {} = {} tokens per micro-batch{}, {}\n",
                       in.batch,
                       in.seq,
                       grouped(in.batch * in.seq),
                       seg.count > 1 ? fmt::format(" in {} segments of up to {}", seg.count, grouped(seg.longest)) : "",
                       precision_text(in.precision));
    out += fmt::format("  mesh       {} (world {}); {}\n",
                       mesh_describe(in.mesh),
                       in.mesh.world(),
                       plan.zero          ? fmt::format("ZeRO-1 shards the moments, {} gradient buckets", plan.buckets)
                       : plan.buckets > 0 ? fmt::format("replicated optimizer, {} gradient buckets", plan.buckets)
                                          : std::string("one data rank: no gradient reduction"));
    if (plan.vision_tokens > 0)
        out += fmt::format("  images     up to {} image tokens ({} ViT patches) per micro-batch\n",
                           grouped(plan.vision_tokens),
                           grouped(plan.vision_patches));
    out += fmt::format("  recompute  {}\n\n", recompute_text(cfg.recompute));
    auto row = [&](const std::string& label, int64_t device, int64_t host = 0) {
        out += fmt::format("  {:<66} {:>10.3f}", label, gb(device));
        out += host > 0 ? fmt::format(" {:>10.3f}\n", gb(host)) : std::string("\n");
    };
    out += fmt::format("  {:<66} {:>10} {:>10}\n", "", "device GB", "host GB");
    const nn::Precision& p = in.precision;
    row(fmt::format("parameters ({} weights the forward reads)", core::dtype_name(p.param)), plan.weights);
    row(fmt::format("gradients ({})", core::dtype_name(p.master)), plan.grads);
    if (plan.master > 0)
        row(fmt::format("master weights ({})", core::dtype_name(p.master)),
            plan.offload ? 0 : plan.master,
            plan.offload ? plan.master : 0);
    else
        out += fmt::format("  {:<66} {:>10}\n", "master weights (the weights themselves)", "-");
    row(fmt::format("optimizer state (AdamW m and v, {}{})",
                    core::dtype_name(in.state_dtype),
                    plan.zero ? ", ZeRO-1 share" : ""),
        plan.offload ? 0 : plan.optimizer,
        plan.offload ? plan.optimizer : 0);
    row("state", plan.state_device(), plan.state_host());
    const std::string acts =
        seg.count > 1
            ? fmt::format("activations of segment {} ({} tokens), GB", seg.peak_index + 1, grouped(seg.peak_length))
            : std::string("activations after the forward, GB");
    out += fmt::format("\n  {:<46} {:>10} {:>10} {:>10}\n", acts, "saved", "other", "rebuilt");
    for (int k = 0; k < kPlanKinds; ++k) {
        const auto kind = static_cast<PlanKind>(k);
        const MemoryActivations& a = plan.activations[static_cast<size_t>(k)];
        const auto [count, what] = instances(cfg, kind);
        if (a.saved + a.held + a.dropped == 0) continue;
        std::string label(what);
        if (kind != PlanKind::embed_head && kind != PlanKind::grad_buffers) {
            const bool one = count == 1 && std::string_view(what) == "layers";
            label = fmt::format("{} ({} {})", plan_kind_name(kind), count, one ? "layer" : what);
        }
        out += fmt::format("    {:<44} {:>10.3f} {:>10.3f} {:>10.3f}\n", label, gb(a.saved), gb(a.held), gb(a.dropped));
    }
    out += fmt::format("    {:<44} {:>10.3f} {:>10.3f}\n\n", "all", gb(plan.saved_total), gb(plan.held_total));
    if (seg.count > 1) {
        out += fmt::format("  sequence segments, held all step{}\n",
                           seg.offload ? " (long.offload_kv: the caches in pinned host memory)" : "");
        std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> lines;  // label -> device, host bytes
        for (const PlanSegmentBuffer& b : seg.buffers) {
            const std::string label = segment_label(b, cfg, seg.count);
            auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == label; });
            if (it == lines.end()) it = lines.insert(lines.end(), {label, {0, 0}});
            const bool host = in.precision.device == core::Device::cuda && b.where != SegmentWhere::device;
            (host ? it->second.second : it->second.first) += b.bytes();
        }
        for (const auto& [label, bytes] : lines) row("  " + label, bytes.first, bytes.second);
        row("  all", seg.device, seg.host);
        out += "\n";
    }
    row("backward workspace (d_norm, d_tmp and the slots)", plan.workspace);
    if (plan.comm > 0) row("communication buffers (ZeRO-1 staging, MoE all-to-all)", plan.comm);
    if (plan.gemm_workspace > 0) row("GEMM workspaces (cuBLASLt)", plan.gemm_workspace);
    row("largest transient (rebuilt activations and op scratch)", plan.transient);
    out += fmt::format("      at {}\n", plan.transient_at);
    if (seg.transient_keys > 0)
        out += fmt::format("      of which {:.3f} GB of key rows ({}the attention backward's dK, dV)\n",
                           gb(seg.transient_keys),
                           seg.offload ? "the offloaded caches' staging and " : "");
    if (plan.rounding > 0) row("allocator size classes (included above in the peak)", plan.rounding);
    row("predicted peak", plan.peak, plan.host_peak());
    row("  of which beyond the state (bench_train's peak_activation_bytes)", plan.peak - plan.state_device());
    out += "\n  notes:\n";
    for (const std::string& n : plan.notes) out += wrapped(n, "    - ", "      ", 118);
    return out;
}

}  // namespace mt::parallel
