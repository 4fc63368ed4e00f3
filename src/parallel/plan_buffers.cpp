// The planner's per-layer buffer lists: each function below follows one layer's resize() (shapes, dtypes, the names
// of saved_for_backward()), its reserve_scratch() (the workspace slots) and, on CUDA, the scratch its ops allocate
// inside a call. Read them beside the layer they name.
#include "parallel/plan_buffers.h"

#include <algorithm>
#include <utility>

namespace mt::parallel {

namespace {

using core::DType;
using nn::RecomputeModule;

struct Dims {
    const nn::ModelConfig& cfg;
    const nn::Precision& p;
    int64_t b, t, n, ep;
    bool cuda, deterministic;
};

PlanBuffer buffer(PlanKind kind, std::string name, int64_t numel, DType dtype, bool saved, bool dropped = false) {
    return {kind, std::move(name), numel * static_cast<int64_t>(core::dtype_size(dtype)), saved, dropped};
}

void reserve(std::array<int64_t, nn::Workspace::kSlots>& slots, int index, int64_t bytes) {
    slots[static_cast<size_t>(index)] = std::max(slots[static_cast<size_t>(index)], bytes);
}

// ---- AttentionLayer (nn/layers/attention_layer.cpp) ----

// window: a window layer (its global tokens' keys and values [g, Hkv, D] are kept whatever the policy).
void attention(const Dims& d, bool window, PlanSubLayer& s, std::array<int64_t, nn::Workspace::kSlots>& slots) {
    const int64_t hd = d.cfg.resolved_head_dim(), hq = d.cfg.n_heads, hkv = d.cfg.n_kv_heads;
    const bool drop = d.cfg.recompute.drops(RecomputeModule::attn_core);
    const DType act = d.p.compute;
    for (const char* name : {"q", "k", "v", "attn"}) {
        const int64_t heads = name[0] == 'k' || name[0] == 'v' ? hkv : hq;
        s.buffers.push_back(buffer(PlanKind::attention, name, d.n * heads * hd, act, true, drop));
    }
    s.buffers.push_back(buffer(PlanKind::attention, "lse", d.b * hq * d.t, d.p.stats, true, drop));
    const int64_t g = window ? d.cfg.attn.global_tokens : 0;
    for (const char* name : {"kg", "vg"})
        if (g > 0) s.buffers.push_back(buffer(PlanKind::attention, name, g * hkv * hd, act, true));
    const int64_t a = static_cast<int64_t>(core::dtype_size(act));
    reserve(slots, 0, d.n * hq * hd * a), reserve(slots, 1, d.n * hq * hd * a);
    reserve(slots, 2, d.n * hkv * hd * a), reserve(slots, 3, d.n * hkv * hd * a);
    if (!d.cuda) return;
    const int64_t bwd = plan_attention_bwd_scratch(d.b, hq, d.t, hd, act, d.deterministic);
    s.bwd_scratch = bwd;
    s.bwd_scratch_op = "attention_bwd";
    if (g == 0 && !d.cfg.attn.sink_logit) return;
    // ops/cuda/attention/attention_global.cu, after attention_bwd freed its own: p and ds per (token, head, global
    // token), the sink terms per (token, head), the per-chunk partial sums of dkg and dvg.
    const int64_t rows = d.n * hq, chunks = (d.n + 1023) / 1024;
    const int64_t global = (2 * rows * g + (d.cfg.attn.sink_logit ? rows : 0) + chunks * g * hkv * 2 * hd) * 4;
    if (global > bwd) {
        s.bwd_scratch = global;
        s.bwd_scratch_op = "attention_global_bwd";
    }
}

// ---- KdaLayer (nn/layers/kda_layer.cpp) and the CUDA KDA op (ops/cuda/kda/kda.cu, kda_bwd.cu) ----

// What the KDA op keeps and how its work buffers are laid out: per (batch, value head, chunk) tiles of f32.
struct KdaChunks {
    int64_t chunks, c, k, v;
    bool tc, chunk_tc, chunk_smem;
    int64_t tile(int64_t rows, int64_t cols) const {
        return chunks * rows * cols * 4;
    }
};

KdaChunks kda_chunks(const Dims& d) {
    const int64_t hv = d.cfg.kda_num_v_heads(), k = d.cfg.kda_head_dim(), v = d.cfg.kda_head_v_dim();
    const int64_t c = d.cfg.kda.chunk_size, nc = (d.t + c - 1) / c;
    KdaChunks kc{d.b * hv * nc, c, k, v, false, false, false};
    // kda::make_plan: the tensor-core path for half inputs with K % 16 == 0, K <= 128, V % 16 == 0; its chunk
    // products need V % 32 == 0, the shared-memory chunk kernel K = V = 128.
    kc.tc = d.cuda && d.p.compute != DType::f32 && k % 16 == 0 && k <= 128 && v % 16 == 0;
    kc.chunk_tc = kc.tc && v % 32 == 0;
    kc.chunk_smem = kc.chunk_tc && k == 128 && v == 128;
    return kc;
}

// kda::work_alloc: the chunk workspace a call allocates for what the caller did not give (kept tiles).
int64_t kda_work(const KdaChunks& kc, bool scan_only, bool given_tiles, bool given_ws, bool with_u) {
    int64_t bytes = 0;
    if (!given_ws) bytes += 4 * kc.tile(kc.c, kc.k);                   // gam, qg, kg, w
    if (!scan_only) bytes += kc.tile(kc.c, kc.k);                      // xw
    if (with_u) bytes += kc.tile(kc.c, kc.v);                          // u
    if (!given_tiles) bytes += kc.tile(kc.c, kc.c);                    // a
    if (!scan_only && !given_tiles) bytes += 2 * kc.tile(kc.c, kc.c);  // m, t
    return bytes;
}

// kda_fwd's scratch when the forward keeps `keep` (kda.save's level) in its KdaSaved.
int64_t kda_fwd_scratch(const KdaChunks& kc, nn::KdaSave keep) {
    if (!kc.tc) return kda_work(kc, false, false, false, true);
    return kda_work(kc, true, keep >= nn::KdaSave::tiles, keep >= nn::KdaSave::workspace, true);
}

// kda_bwd's scratch given what the forward kept.
int64_t kda_bwd_scratch(const Dims& d, const KdaChunks& kc, nn::KdaSave kept) {
    const bool tiles = kc.tc && kept >= nn::KdaSave::tiles;
    const bool states16 = kc.chunk_tc && kept == nn::KdaSave::states_bf16;
    const bool states = (tiles && kept >= nn::KdaSave::states) || states16;
    const bool ws = states && kept >= nn::KdaSave::workspace;
    int64_t bytes = kda_work(kc, false, tiles, ws, !states);
    bytes += kc.tile(kc.k, kc.v) + kc.tile(kc.c, kc.v);                 // dhs, dvn
    if (!states) bytes += kc.tile(kc.k, kc.v) + kc.tile(kc.c, kc.v);    // the states and Vn, recomputed
    if (tiles && kc.chunk_tc) bytes += kc.tile(kc.c, kc.c);             // dA beside the kept A
    bytes += 3 * kc.tile(kc.c, kc.k) + (ws ? kc.tile(kc.c, kc.k) : 0);  // dqg, dkg, dw (+ dxw beside a kept W)
    if (states) bytes += kc.tile(kc.c, kc.v);                           // dxu (no U to reuse)
    if (kc.chunk_tc) bytes += kc.chunks * kc.k * 4;                     // the chunk products' dg
    if (d.cfg.kda_num_v_heads() != d.cfg.kda_num_heads())               // dq, dk per value head (GVA)
        bytes += 2 * d.n * d.cfg.kda_num_v_heads() * kc.k * 4;
    if (kc.chunk_smem) bytes += kc.chunks * 4;
    return bytes;
}

void kda(const Dims& d, PlanSubLayer& s, std::array<int64_t, nn::Workspace::kSlots>& slots) {
    const nn::ModelConfig& cfg = d.cfg;
    const int64_t h = cfg.kda_num_heads(), hv = cfg.kda_num_v_heads(), k = cfg.kda_head_dim(), v = cfg.kda_head_v_dim();
    const int64_t hk = h * k, hvk = hv * k, hvv = hv * v, n = d.n;
    const bool drop = cfg.recompute.drops(RecomputeModule::kda);
    const DType act = d.p.compute, stats = d.p.stats;
    auto add = [&](const char* name, int64_t numel, DType dtype, bool saved = true) {
        s.buffers.push_back(buffer(PlanKind::kda, name, numel, dtype, saved, saved && drop));
    };
    add("qp", n * hk, act), add("kp", n * hk, act), add("vp", n * hvv, act);
    add("qc", n * hk, act), add("kc", n * hk, act), add("vc", n * hvv, act);
    add("q", n * hk, act), add("k", n * hk, act), add("rq", n * h, stats), add("rk", n * h, stats);
    add("bl", n * hv, act, false);  // the beta logits: scratch the layer keeps, not saved
    add("beta", n * hv, act);
    add("fa", n * k, act), add("u", n * hvk, act), add("g", n * hvk, act);
    add("o", n * hvv, act);
    add("st", d.b * hvv * k, stats, false);  // the final state S_T
    add("on", n * hvv, act), add("rstd", n * hv, stats);
    add("ga", n * v, act), add("gz", n * hvv, act), add("y", n * hvv, act);
    const int64_t a = static_cast<int64_t>(core::dtype_size(act));
    reserve(slots, 0, n * std::max({hvv, v, hvk, hv, hk}) * a);
    reserve(slots, 1, n * std::max(hvv, hk) * a), reserve(slots, 2, n * std::max(hvv, hk) * a);
    reserve(slots, 3, n * hvv * a), reserve(slots, 4, n * std::max({hvk, k, hk}) * a);
    reserve(slots, 5, n * std::max(hv, hvv) * a);
    if (!d.cuda) return;
    // What the op keeps (ops/kda.h KdaSaved; tensor-core path only). A forward that is re-run in the backward
    // (recompute kda or full) keeps nothing the first time and its tiles while the re-run's backward runs.
    const KdaChunks kc = kda_chunks(d);
    const nn::KdaSave save = kc.tc ? cfg.kda.save : nn::KdaSave::none;
    const bool rerun = drop || cfg.recompute.full();
    auto kept = [&](const char* name, int64_t rows, int64_t cols, int64_t halves = 2) {  // halves: 1 for bf16
        s.buffers.push_back({PlanKind::kda, name, kc.tile(rows, cols) / 2 * halves, true, rerun});
    };
    if (save >= nn::KdaSave::tiles) kept("kept.a", kc.c, kc.c), kept("kept.m", kc.c, kc.c), kept("kept.t", kc.c, kc.c);
    if (save >= nn::KdaSave::states) kept("kept.hs", kc.k, kc.v), kept("kept.vn", kc.c, kc.v);
    if (save == nn::KdaSave::states_bf16 && kc.chunk_tc) kept("kept.hs", kc.k, kc.v, 1), kept("kept.vn", kc.c, kc.v, 1);
    if (save >= nn::KdaSave::workspace)
        for (const char* name : {"kept.gam", "kept.qg", "kept.kg", "kept.w"}) kept(name, kc.c, kc.k);
    s.fwd_scratch = kda_fwd_scratch(kc, rerun ? nn::KdaSave::none : save);
    s.fwd_scratch_op = "kda_fwd";
    s.bwd_scratch = std::max(rerun ? kda_fwd_scratch(kc, save) : 0, kda_bwd_scratch(d, kc, save));
    s.bwd_scratch_op = "kda_bwd";
}

// ---- Mlp (nn/layers/mlp.cpp), also the MoE layer's shared experts ----

void mlp(const Dims& d,
         PlanKind kind,
         const std::string& prefix,
         int64_t f,
         bool drop_act,
         PlanSubLayer& s,
         std::array<int64_t, nn::Workspace::kSlots>& slots) {
    for (const char* name : {"gate", "up", "act"})
        s.buffers.push_back(
            buffer(kind, prefix + name, d.n * f, d.p.compute, true, drop_act && std::string_view(name) == "act"));
    for (int i = 0; i < 3; ++i) reserve(slots, i, d.n * f * static_cast<int64_t>(core::dtype_size(d.p.compute)));
}

// ---- MoeLayer (nn/layers/moe_layer.cpp), its balancer (moe_balance.cpp) and dispatch (moe_dispatch.cpp) ----

void moe(const Dims& d,
         PlanSubLayer& s,
         std::vector<PlanBuffer>& comm,
         std::array<int64_t, nn::Workspace::kSlots>& slots) {
    const nn::MoeConfig& m = d.cfg.moe;
    const int64_t e = m.num_experts, k = m.top_k, c = d.cfg.d_model, f = m.expert_ffn_dim, n = d.n, r = n * k;
    // Expert-side rows: N k without expert parallelism; under it, the rows arriving (balanced: N k as well).
    const int64_t cap = r;
    const bool drop_act = d.cfg.recompute.drops(RecomputeModule::moe_act);
    const bool drop_permute = d.cfg.recompute.drops(RecomputeModule::moe_permute);
    const bool drop_experts = d.cfg.recompute.drops(RecomputeModule::moe_experts);
    const DType act = d.p.compute, route = d.p.stats;
    auto add = [&](const char* name, int64_t numel, DType dtype, bool saved, bool dropped = false) {
        s.buffers.push_back(buffer(PlanKind::moe, name, numel, dtype, saved, dropped));
    };
    add("logits", n * e, act, false);
    add("scores", n * e, route, true), add("indices", n * k, DType::i32, true), add("gates", n * k, route, true);
    add("cutoff", n, route, false), add("bias", e, route, false);
    add("offsets", e + 1, DType::i32, true), add("slot_row", n * k, DType::i32, true);
    add("row_token", r, DType::i32, true);
    add("xp", r * c, act, true, drop_permute), add("yp", r * c, act, true, drop_experts);
    if (m.balance.mode == nn::MoeBalanceMode::aux_loss) add("d_scores_aux", n * e, route, true);
    add("hg", cap * f, act, true, drop_experts), add("hu", cap * f, act, true, drop_experts);
    add("act", cap * f, act, true, drop_act || drop_experts);
    if (d.ep > 1) add("xe", cap * c, act, false, drop_permute), add("ye", cap * c, act, false, drop_experts);
    add("step_load_acc", e, DType::i64, false), add("step_entropy_acc", 1, DType::f64, false);
    // The balancer's counts of the step's routing, on the routing device (QB adds its [E, bins] histogram).
    add("balancer.loads", e, DType::i64, false);
    if (m.balance.mode == nn::MoeBalanceMode::quantile) add("balancer.hist", e * m.balance.bins, DType::i64, false);
    if (d.ep > 1) {  // the all-to-all's staging rows and the row orders of the received rows
        comm.push_back(buffer(PlanKind::moe, "dispatch.staging", cap * c, act, false));
        comm.push_back(buffer(PlanKind::moe, "dispatch.by_expert", cap, DType::i32, false));
        comm.push_back(buffer(PlanKind::moe, "dispatch.by_source", cap, DType::i32, false));
    }
    const int64_t a = static_cast<int64_t>(core::dtype_size(act));
    reserve(slots, 0, r * c * a);
    reserve(slots, 1, std::max(d.ep > 1 ? cap * c : 0, n * e) * a);
    reserve(slots, 2, std::max(cap * f, cap * c) * a);
    reserve(slots, 3, cap * f * a), reserve(slots, 4, cap * f * a);
    reserve(slots, 5, n * c * a);
    reserve(slots, 6, n * k * static_cast<int64_t>(core::dtype_size(route)));
    if (m.num_shared_experts > 0) {
        mlp(d, PlanKind::moe, "shared.", f * m.num_shared_experts, drop_act, s, slots);
        add("shared_out", n * c, act, false);
    }
}

// ---- AttnResStack (nn/layers/attnres.cpp) ----

// Sources of mix l (AttnResStack::sources_of): the embedding, the completed blocks, the running partial sum.
int64_t attnres_sources(int64_t l, int64_t layers, int64_t block) {
    const int64_t first = l == layers ? layers : (l / block) * block;
    int64_t m = 1;
    for (int64_t end = block - 1; end < first; end += block) ++m;
    if (l == layers && layers % block != 0) ++m;
    if (l < layers && l > first) ++m;
    return m;
}

void attnres(const Dims& d, PlanActivations& out) {
    const int64_t layers = 2 * d.cfg.n_layers, block = d.cfg.attnres.resolved_block_size(), nc = d.n * d.cfg.d_model;
    const bool drop = d.cfg.recompute.drops(RecomputeModule::attnres);
    const DType act = d.p.compute, acc = d.p.master;
    for (int64_t l = 0; l <= layers; ++l) {
        const std::string i = std::to_string(l);
        if (l < layers) out.attnres.push_back(buffer(PlanKind::attnres, "partial." + i, nc, act, true));
        out.attnres.push_back(buffer(PlanKind::attnres, "mixed." + i, nc, act, true, drop && l < layers));
        out.attnres.push_back(
            buffer(PlanKind::attnres, "alpha." + i, d.n * attnres_sources(l, layers, block), d.p.stats, true));
        if (l < layers) out.attnres.push_back(buffer(PlanKind::grad_buffers, "attnres.d_partial." + i, nc, acc, false));
    }
    out.attnres.push_back(buffer(PlanKind::grad_buffers, "attnres.d_embed", nc, acc, false));
    out.attnres.push_back(buffer(PlanKind::grad_buffers, "attnres.d_branch", nc, act, false));
    out.attnres.push_back(buffer(PlanKind::grad_buffers, "attnres.d_mixed", nc, act, false));
    if (acc != act) out.attnres.push_back(buffer(PlanKind::grad_buffers, "attnres.zero", nc, act, false));
    out.attnres_mixed = drop ? nc * static_cast<int64_t>(core::dtype_size(act)) : 0;
}

}  // namespace

std::string_view plan_kind_name(PlanKind kind) {
    static constexpr std::array<std::string_view, kPlanKinds> names = {
        "attention", "kda", "mlp", "moe", "norm", "residual", "attnres", "embed_head", "grad_buffers", "vision"};
    return names[static_cast<size_t>(kind)];
}

int64_t plan_attention_bwd_scratch(
    int64_t b, int64_t heads, int64_t t, int64_t head_dim, core::DType act, bool deterministic) {
    // ops/cuda/attention/attention.cu: the backward's f32 row sums (delta, one per lse entry) and, when
    // run.deterministic is off and the wgmma flash kernel runs (bf16, a head dim that is a multiple of 8 up to 128:
    // flash_supports), its f32 dq accumulator over 64-row blocks of the head dim's tile (64 or 128 columns:
    // flash_tile_d; flash_bwd_wgmma_fast_accum_floats).
    int64_t bytes = b * heads * t * 4;
    if (!deterministic && act == DType::bf16 && head_dim >= 8 && head_dim <= 128 && head_dim % 8 == 0)
        bytes += b * heads * ((t + 63) / 64 * 64) * (head_dim <= 64 ? 64 : 128) * 4;
    return bytes;
}

PlanActivations plan_activations(const nn::ModelConfig& cfg,
                                 const nn::Precision& precision,
                                 int64_t batch,
                                 int64_t seq,
                                 int64_t ep_size,
                                 bool deterministic) {
    const Dims d{
        cfg, precision, batch, seq, batch * seq, ep_size, precision.device == core::Device::cuda, deterministic};
    const int64_t n = d.n, c = cfg.d_model;
    const DType act = precision.compute, stats = precision.stats;
    PlanActivations out;
    // Model::resize: the batch on the device, the embedding output, final norm, one LM-head chunk's logits
    // (loss.chunk_tokens rows; the backward recomputes the others into the same buffer), the loss rows, and the
    // residual stream's two gradient buffers (the host copy of the targets is host memory on a GPU).
    out.model = {buffer(PlanKind::embed_head, "ids", n, DType::i32, false),
                 buffer(PlanKind::embed_head, "targets", n, DType::i32, false),
                 buffer(PlanKind::embed_head, "embed_out", n * c, act, true),
                 buffer(PlanKind::embed_head, "final_norm", n * c, act, true),
                 buffer(PlanKind::embed_head, "final_rstd", n, stats, true),
                 buffer(PlanKind::embed_head, "logits", cfg.loss_chunk_rows(n) * cfg.vocab_size, act, true),
                 buffer(PlanKind::embed_head, "losses", n, stats, false),
                 buffer(PlanKind::embed_head, "lse", n, stats, true),
                 buffer(PlanKind::grad_buffers, "dres_a", n * c, act, false),
                 buffer(PlanKind::grad_buffers, "dres_b", n * c, act, false)};
    if (!d.cuda) out.model.push_back(buffer(PlanKind::embed_head, "host_targets", n, DType::i32, false));
    if (cfg.attnres.enabled()) attnres(d, out);
    const bool full = cfg.recompute.full();
    out.branch_recompute = full && cfg.attnres.enabled();
    out.full_group = full && !cfg.attnres.enabled() ? cfg.recompute.group_size(cfg.n_layers) : 0;
    const bool drop_norm = cfg.recompute.drops(RecomputeModule::norm);
    std::array<int64_t, nn::Workspace::kSlots> slots{};
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
        PlanBlock b;
        for (int sub = 0; sub < 2; ++sub) {  // Block::resize: each sub-layer's pre-norm output and 1/rms rows
            PlanSubLayer& s = b.sub[static_cast<size_t>(sub)];
            const std::string i = std::to_string(sub + 1);
            s.buffers.push_back(buffer(PlanKind::norm, "norm" + i, n * c, act, true, drop_norm));
            s.buffers.push_back(buffer(PlanKind::norm, "rstd" + i, n, stats, true));
        }
        if (cfg.layer_is_kda(l))
            kda(d, b.sub[0], slots);
        else
            attention(d, cfg.layer_is_window(l), b.sub[0], slots);
        if (cfg.layer_is_moe(l))
            moe(d, b.sub[1], out.comm, slots);
        else
            mlp(d,
                PlanKind::mlp,
                "",
                cfg.dense_ffn_dim(),
                cfg.recompute.drops(RecomputeModule::mlp_act),
                b.sub[1],
                slots);
        // Block::resize: under Block AttnRes the stack holds the residual stream, and a block allocates no h or output.
        const int64_t residual_rows = cfg.attnres.enabled() ? 0 : n;
        b.h = buffer(PlanKind::residual, "h", residual_rows * c, act, true, out.full_group > 0);
        b.out = buffer(PlanKind::residual, "out", residual_rows * c, act, true);
        if (full) {  // Block::release_activations (or, under AttnRes, each sub-layer's branch_saved): the saved lists
            for (PlanSubLayer& s : b.sub)
                for (PlanBuffer& buf : s.buffers) buf.dropped = buf.dropped || buf.saved;
        }
        // Model::keeps_output: a group's last block and the model's last keep their output through the forward.
        if (out.full_group > 0) b.keeps_output = (l + 1) % out.full_group == 0 || l == cfg.n_layers - 1;
        out.blocks.push_back(std::move(b));
    }
    // Workspace::resize and the slots at their largest reservation (Model::resize reserves every layer's).
    out.workspace = {buffer(PlanKind::grad_buffers, "ws.d_norm", n * c, act, false),
                     buffer(PlanKind::grad_buffers, "ws.d_tmp", n * c, act, false)};
    for (int i = 0; i < nn::Workspace::kSlots; ++i)
        if (slots[static_cast<size_t>(i)] > 0)
            out.workspace.push_back(
                {PlanKind::grad_buffers, "ws.slot" + std::to_string(i), slots[static_cast<size_t>(i)]});
    return out;
}

}  // namespace mt::parallel
