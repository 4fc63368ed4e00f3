// Entry points of KDA: argument checks, then the CPU reference (recurrent or chunked, f32 or f64) or, for tensors on
// a CUDA device, the CUDA chunked algorithm (ops/cuda/kda/kda.cu: bf16/f16/f32 inputs, f32 states).
#include "ops/kda.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ops/cpu/checks.h"
#include "ops/cpu/documents.h"
#include "ops/cpu/kda.h"
#include "ops/cpu/kda_pack.h"
#include "ops/moe_permute.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; s0 [B, HV, K, V] or undefined. Ranks,
// contiguity and shapes, on any device; check_cpu_dtypes adds the CPU dtype rules.
cpu::KdaDims check_inputs(const Tensor& q,
                          const Tensor& k,
                          const Tensor& v,
                          const Tensor& g,
                          const Tensor& beta,
                          const Tensor& s0,
                          const KdaOptions& options,
                          std::string_view op) {
    check_arg(q, op, "q", 4);
    check_arg(k, op, "k", 4);
    check_arg(v, op, "v", 4);
    check_arg(g, op, "g", 4);
    check_arg(beta, op, "beta", 3);
    const cpu::KdaDims d{q.size(0), q.size(1), q.size(2), v.size(2), q.size(3), v.size(3)};
    check_shape(k, q.shape(), op, "k");
    MT_CHECK(d.h > 0 && d.hv % d.h == 0, "{}: q has {} heads and v has {}; HV must be a multiple of H", op, d.h, d.hv);
    MT_CHECK(d.b > 0 && d.t > 0, "{}: q has shape {}; B and T must be > 0", op, core::shape_str(q.shape()));
    MT_CHECK(d.k > 0 && d.k <= 256, "{}: key head dim K = {} must be in [1, 256]", op, d.k);
    MT_CHECK(d.v > 0, "{}: value head dim V = {} must be > 0", op, d.v);
    check_shape(v, {d.b, d.t, d.hv, d.v}, op, "v");
    check_shape(g, {d.b, d.t, d.hv, d.k}, op, "g");
    check_shape(beta, {d.b, d.t, d.hv}, op, "beta");
    if (s0.defined()) {
        check_arg(s0, op, "s0", 4);
        check_shape(s0, {d.b, d.hv, d.k, d.v}, op, "s0");
    }
    if (options.algorithm == KdaAlgorithm::chunked)
        MT_CHECK(options.chunk_size == 64 || options.chunk_size == 32,
                 "{}: chunk_size = {}; the chunked algorithm takes 64 or 32",
                 op,
                 options.chunk_size);
    for (const auto& [name, bv] :
         {std::pair{"scan_bv", options.kernels.scan_bv}, std::pair{"rscan_bv", options.kernels.rscan_bv}})
        MT_CHECK(bv == 0 || bv == 16 || bv == 32 || bv == 64 || bv == 128,
                 "{}: KdaKernels::{} = {}; it takes 0 (per shape), 16, 32, 64 or 128",
                 op,
                 name,
                 bv);
    return d;
}

// KdaOptions::chunk_reset, when defined: [B, ceil(T / C)] i32 on the inputs' device, chunked algorithm, no doc_start.
void check_chunk_reset(const KdaOptions& options, const cpu::KdaDims& d, core::Device device, std::string_view op) {
    const Tensor& r = options.chunk_reset;
    if (!r.defined()) return;
    check_arg(r, op, "options.chunk_reset", 2);
    MT_CHECK(
        r.dtype() == DType::i32, "{}: options.chunk_reset has dtype {}, expected i32", op, core::dtype_name(r.dtype()));
    // The algorithm (and so a chunk size the inputs' checks accepted) before the shape, which divides by it.
    MT_CHECK(options.algorithm == KdaAlgorithm::chunked && options.chunk_size > 0,
             "{}: options.chunk_reset needs the chunked algorithm",
             op);
    check_shape(r, {d.b, (d.t + options.chunk_size - 1) / options.chunk_size}, op, "options.chunk_reset");
    MT_CHECK(r.device() == device, "{}: options.chunk_reset is not on the inputs' device", op);
    MT_CHECK(!options.doc_start.defined(), "{}: options.chunk_reset and options.doc_start exclude each other", op);
}

// Whether a call with a document map runs the packed (varlen) path: KdaDocuments::automatic packs on the GPU, where
// one set of launches per document is slow (the chunked algorithm: the recurrent one splits), and splits on the CPU,
// whose split is the reference the packed path is tested against.
bool packs_documents(const KdaOptions& options, core::Device device, std::string_view op) {
    if (options.documents == KdaDocuments::packed)
        MT_CHECK(
            options.algorithm == KdaAlgorithm::chunked, "{}: KdaDocuments::packed runs the chunked algorithm only", op);
    return options.documents == KdaDocuments::packed ||
           (options.documents == KdaDocuments::automatic && device == core::Device::cuda &&
            options.algorithm == KdaAlgorithm::chunked);
}

// What a CPU call ran, for KdaOptions::chosen.
void note_cpu_choice(const KdaOptions& options) {
    if (options.chosen == nullptr) return;
    *options.chosen = options.algorithm == KdaAlgorithm::recurrent ? "cpu-recurrent"
                      : options.diagonal == KdaDiagonal::pairwise  ? "cpu-chunked-pairwise"
                                                                   : "cpu-chunked";
}

// A state-shaped tensor [B, HV, K, V], or undefined.
void check_optional_state(const Tensor& t, const cpu::KdaDims& d, std::string_view op, const char* name) {
    if (!t.defined()) return;
    check_arg(t, op, name, 4);
    check_shape(t, {d.b, d.hv, d.k, d.v}, op, name);
}

void check_like(const Tensor& t, const Tensor& ref, std::string_view op, const char* name) {
    check_arg(t, op, name, static_cast<int>(ref.ndim()));
    check_shape(t, ref.shape(), op, name);
}

// The CUDA path runs the chunked algorithm only.
void check_cuda_algorithm(const KdaOptions& options, std::string_view op) {
    MT_CHECK(options.algorithm == KdaAlgorithm::chunked,
             "{}: the CUDA path implements the chunked algorithm only (the recurrence is the CPU reference)",
             op);
}

// A KdaSaved from kda_fwd must fit this call: each defined tensor f32, on the inputs' device, with the element count
// of its shape (KdaSaved in kda.h). A KdaSaved from another shape or chunk size is caught here, by name.
void check_saved(
    const KdaSaved& s, const cpu::KdaDims& d, const KdaOptions& options, core::Device device, std::string_view op) {
    // First, as the shapes would differ too: a KdaSaved of packed rows (kda_bwd_packed hands its own call a copy
    // with layout 0).
    MT_CHECK(s.layout == 0,
             "{}: saved was kept by a forward over packed documents (options.doc_start); this call has no document map",
             op);
    const int64_t c = options.chunk_size, chunks = d.b * d.hv * ((d.t + c - 1) / c);
    const struct {
        const char* name;
        const Tensor& t;
        int64_t numel;
    } parts[] = {{"saved.a", s.a, chunks * c * c},
                 {"saved.m", s.m, chunks * c * c},
                 {"saved.t", s.t, chunks * c * c},
                 {"saved.hs", s.hs, chunks * d.k * d.v},
                 {"saved.vn", s.vn, chunks * c * d.v},
                 {"saved.gam", s.gam, chunks * c * d.k},
                 {"saved.qg", s.qg, chunks * c * d.k},
                 {"saved.kg", s.kg, chunks * c * d.k},
                 {"saved.w", s.w, chunks * c * d.k}};
    MT_CHECK(s.a.defined() == s.t.defined() && s.m.defined() == s.t.defined(),
             "{}: saved.a, saved.m and saved.t must be all defined or all undefined",
             op);
    MT_CHECK(s.hs.defined() == s.vn.defined(), "{}: saved.hs and saved.vn come together", op);
    const bool ws = s.w.defined();
    MT_CHECK(s.gam.defined() == ws && s.qg.defined() == ws && s.kg.defined() == ws &&
                 (!ws || (s.t.defined() && s.hs.defined())),
             "{}: saved.gam, saved.qg, saved.kg and saved.w come together, and only with the tiles and the states",
             op);
    // The states are f32 beside the tiles (save_states, save_workspace) and bf16 without them (save_states_bf16).
    const DType states_dtype = s.t.defined() ? DType::f32 : DType::bf16;
    auto shapes = [](int64_t b, int64_t t, int64_t hv, int64_t k, int64_t v, int64_t chunk) {
        return fmt::format("B = {}, T = {}, HV = {}, K = {}, V = {}, chunk {}", b, t, hv, k, v, chunk);
    };
    const std::string call = shapes(d.b, d.t, d.hv, d.k, d.v, c);
    for (const auto& p : parts) {
        if (!p.t.defined()) continue;
        const bool state = &p.t == &s.hs || &p.t == &s.vn;
        const DType want = state ? states_dtype : DType::f32;
        MT_CHECK(p.t.device() == device && p.t.dtype() == want && p.t.is_contiguous() &&
                     reinterpret_cast<uintptr_t>(p.t.raw()) % 16 == 0,
                 "{}: {} must be a contiguous, 16-byte aligned {} tensor on the inputs' device{}",
                 op,
                 p.name,
                 core::dtype_name(want),
                 state ? (s.t.defined() ? " (f32 beside the tiles)"
                                        : " (bf16 without the tiles: f32 states come only with saved.a, saved.m and "
                                          "saved.t)")
                       : "");
        MT_CHECK(p.t.numel() == p.numel,
                 "{}: {} has {} elements, expected {} for {}; it was saved by a kda_fwd of other shapes",
                 op,
                 p.name,
                 p.t.numel(),
                 p.numel,
                 call);
    }
    if (s.empty()) return;
    MT_CHECK(s.b == d.b && s.seq == d.t && s.hv == d.hv && s.k == d.k && s.v == d.v && s.chunk == c,
             "{}: saved was kept by a kda_fwd of {}; this call has {}",
             op,
             shapes(s.b, s.seq, s.hv, s.k, s.v, s.chunk),
             call);
}

// Document masking: each document of a row runs as its own sequence (the state restarts from zero), by the same
// kernel on copies of its rows (ops/cpu/documents.h), on the CPU and, as a first step, on the GPU: exact, but one
// set of launches per document, so a row of many short documents is slow there (the varlen kernels, which restart
// the state inside one launch, are still to come). The spans come from a host copy of a device map.
using cpu::doc_rows;
using cpu::doc_view;
using cpu::DocSpan;

// Row r of a state [B, HV, K, V] as [1, HV, K, V] (a view), or undefined when `use` is false or t is.
Tensor state_row(const Tensor& t, int64_t row, bool use) {
    if (!use || !t.defined()) return Tensor();
    core::Shape shape = t.shape();
    shape[0] = 1;
    return t.select(0, row).reshape(shape);
}

// The documents of a checked map, from a host copy of a device map (the copy waits for the GPU; its values are
// checked here, as the op's entry cannot read a device map's).
std::vector<DocSpan> host_doc_spans(const Tensor& doc_start, std::string_view op) {
    if (doc_start.device() == core::Device::cpu) return cpu::doc_spans(doc_start);
    const Tensor host = doc_start.to_device(core::Device::cpu);
    cpu::check_doc_start_values(host, op, "options.doc_start");
    return cpu::doc_spans(host);
}

void kda_fwd_documents(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& g,
                       const Tensor& beta,
                       const Tensor& s0,
                       const Tensor& out,
                       const Tensor& st,
                       KdaOptions options) {
    const std::vector<DocSpan> spans = host_doc_spans(options.doc_start, "kda_fwd");
    options.doc_start = Tensor();
    for (const DocSpan& sp : spans) {
        const bool first = sp.first == 0, last = sp.end == q.size(1);
        const Tensor o = doc_rows(out, sp);
        MT_CALL_KERNEL(kda_fwd,
                       q.device(),
                       doc_rows(q, sp),
                       doc_rows(k, sp),
                       doc_rows(v, sp),
                       doc_rows(g, sp),
                       doc_rows(beta, sp),
                       state_row(s0, sp.row, first),
                       o,
                       state_row(st, sp.row, last),
                       options,
                       nullptr);
        doc_view(out, sp).copy_from(o.select(0, 0));
    }
}

void kda_bwd_documents(const Tensor& q,
                       const Tensor& k,
                       const Tensor& v,
                       const Tensor& g,
                       const Tensor& beta,
                       const Tensor& s0,
                       const Tensor& dout,
                       const Tensor& dst,
                       const Tensor& dq,
                       const Tensor& dk,
                       const Tensor& dv,
                       const Tensor& dg,
                       const Tensor& dbeta,
                       const Tensor& ds0,
                       KdaOptions options) {
    const std::vector<DocSpan> spans = host_doc_spans(options.doc_start, "kda_bwd");
    options.doc_start = Tensor();
    for (const DocSpan& sp : spans) {
        const bool first = sp.first == 0, last = sp.end == q.size(1);
        const Tensor gq = doc_rows(dq, sp), gk = doc_rows(dk, sp), gv = doc_rows(dv, sp), gg = doc_rows(dg, sp),
                     gb = doc_rows(dbeta, sp);
        MT_CALL_KERNEL(kda_bwd,
                       q.device(),
                       doc_rows(q, sp),
                       doc_rows(k, sp),
                       doc_rows(v, sp),
                       doc_rows(g, sp),
                       doc_rows(beta, sp),
                       state_row(s0, sp.row, first),
                       doc_rows(dout, sp),
                       state_row(dst, sp.row, last),
                       gq,
                       gk,
                       gv,
                       gg,
                       gb,
                       state_row(ds0, sp.row, first),
                       options,
                       nullptr);
        for (const auto& [full, part] : {std::pair{&dq, &gq}, {&dk, &gk}, {&dv, &gv}, {&dg, &gg}, {&dbeta, &gb}})
            doc_view(*full, sp).copy_from(part->select(0, 0));
    }
}

// out [N, ...] = x's rows by map: out row i is x row map[i] ([R, ...] viewed as rows of its trailing dims), or zeros
// where map[i] = -1 (map: i32 [N] on x's device).
// The gather is moe_permute_bwd with one slot per row (dx_i = sum over slots of dxp[slot_row(i, q)], a slot of -1
// adding nothing): on both devices, exact (one term added to zero), any float dtype the KDA kernels take there.
void kda_gather_rows(const Tensor& x, const Tensor& map, const Tensor& out) {
    const int64_t rows = x.size(0) * x.size(1), n = out.size(0) * out.size(1);
    const int64_t c = rows > 0 ? x.numel() / rows : 0;
    MT_CHECK(out.numel() == n * c && map.numel() == n,
             "kda_gather_rows: out has {} elements and map {} for {} rows of {}",
             out.numel(),
             map.numel(),
             n,
             c);
    moe_permute_bwd(map.reshape({n, 1}), x.reshape({rows, c}), out.reshape({n, c}));
}

// Document masking by packing (KdaDocuments::packed, the varlen path): each row's documents are laid out in one
// packed row [B, T'] so that every document starts on a chunk boundary (cpu/kda_pack.h), the tail of each padded to a
// whole chunk with q = k = v = 0, beta = 0, g = 0; KdaOptions::chunk_reset flags the chunk where each document but the
// row's first starts; ONE kda call runs the packed rows, and the outputs and gradients are gathered back. Padding is
// inert: with beta = 0 and g = 0 (log decay 0: no decay) a token leaves the state as it was, k = 0 keeps it out of
// every other token's products and q = 0 makes its output zero, so each document computes what it would alone, up to
// rounding; trailing padding chunks carry the row's last state to st unchanged (and dst back to the last document).
//
// Why pad to chunk boundaries instead of masking inside chunks: with a chunk shared by two documents, the cumulative
// decay Gamma, the tiles A and M, T = (I + L)^-1, W and U would need a document mask inside the chunk, the state
// entering the chunk would reach only the rows before the boundary, and the state leaving it would have to restart
// mid-chunk: every forward and backward kernel (prep, both scans, the chunk step's tensor-core tiles) would change.
// With each chunk inside one document, every per-chunk kernel runs unchanged and only the scans' carry between chunks
// reads a flag. The price is up to C - 1 padding tokens per document (under 3% for 2K-token documents at C = 64).
struct Packed {
    cpu::KdaPackPlan plan;
    Tensor src, dst, reset;  // the plan's maps and flags on the inputs' device
};

// KdaSaved::layout of a packed plan: FNV-1a over T, T' and every packed position's source row; never 0.
uint64_t layout_fingerprint(const cpu::KdaPackPlan& plan) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t x) { h = (h ^ x) * 1099511628211ull; };
    mix(static_cast<uint64_t>(plan.t));
    mix(static_cast<uint64_t>(plan.tp));
    for (const int32_t s : plan.src) mix(static_cast<uint32_t>(s));
    return h | 1u;
}

Packed pack_plan(const Tensor& doc_start, int64_t chunk, std::string_view op) {
    Tensor host = doc_start;
    if (doc_start.device() != core::Device::cpu) {  // a device map is read back once per call (see host_doc_spans)
        host = doc_start.to_device(core::Device::cpu);
        cpu::check_doc_start_values(host, op, "options.doc_start");
    }
    return Packed{cpu::kda_pack_plan(host, chunk), Tensor(), Tensor(), Tensor()};
}

// The plan's maps and flags to the inputs' device, once the packed path is taken.
void upload_maps(Packed& p, core::Device device) {
    auto upload = [device](std::vector<int32_t>& v, const Shape& shape) {
        return Tensor::borrow(v.data(), shape, DType::i32).to_device(device);
    };
    p.src = upload(p.plan.src, {p.plan.b * p.plan.tp});
    p.dst = upload(p.plan.dst, {p.plan.b * p.plan.t});
    p.reset = upload(p.plan.reset, {p.plan.b, p.plan.nc});
}

// KdaDocuments::automatic splits instead when padding would grow the rows more than kMaxPackGrowth times (documents
// averaging under C / 16 tokens): the packed copies and the chunk work grow with the padding, up to C times for
// one-token documents, but the split costs one set of launches per document. At 2x (the first threshold) the
// text-only twin of configs/shapes_gpu.toml (about 85 captions of 12 tokens per 1024-token row, padding 5.3x) split
// 1360 documents per layer and step and ran 12k tokens/s on an H100, a tenth of its image run.
constexpr int64_t kMaxPackGrowth = 16;
bool split_instead(const Packed& p, const KdaOptions& options) {
    return options.documents == KdaDocuments::automatic && p.plan.tp > kMaxPackGrowth * p.plan.t;
}

// x [B, T, ...] in the packed layout [B, T', ...] (padding zero), and back.
Tensor pack(const Packed& p, const Tensor& x) {
    Shape shape = x.shape();
    shape[1] = p.plan.tp;
    const Tensor xp = Tensor::scratch(shape, x.dtype(), x.device());
    kda_gather_rows(x, p.src, xp);
    return xp;
}
void unpack(const Packed& p, const Tensor& xp, const Tensor& x) {
    kda_gather_rows(xp, p.dst, x);
}
Tensor packed_like(const Packed& p, const Tensor& x) {
    Shape shape = x.shape();
    shape[1] = p.plan.tp;
    return Tensor::scratch(shape, x.dtype(), x.device());
}

void note_packed(const KdaOptions& options) {
    if (options.chosen != nullptr) *options.chosen = "packed " + *options.chosen;
}

// saved (may be null): what the call on the packed rows keeps (KdaSaved, of the packed shapes), which
// kda_bwd_packed hands to its own call on the same packed rows; the split fallback keeps nothing.
void kda_fwd_packed(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const Tensor& s0,
                    const Tensor& out,
                    const Tensor& st,
                    KdaOptions options,
                    KdaSaved* saved) {
    Packed p = pack_plan(options.doc_start, options.chunk_size, "kda_fwd");
    if (split_instead(p, options)) return kda_fwd_documents(q, k, v, g, beta, s0, out, st, options);
    options.doc_start = Tensor();
    if (p.plan.one_document_per_row()) return kda_fwd(q, k, v, g, beta, s0, out, st, options, saved);
    upload_maps(p, q.device());
    options.chunk_reset = p.reset;
    const Tensor outp = packed_like(p, out);
    kda_fwd(pack(p, q), pack(p, k), pack(p, v), pack(p, g), pack(p, beta), s0, outp, st, options, saved);
    if (saved != nullptr && !saved->empty()) saved->layout = layout_fingerprint(p.plan);
    unpack(p, outp, out);
    note_packed(options);
}

void kda_bwd_packed(const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& g,
                    const Tensor& beta,
                    const Tensor& s0,
                    const Tensor& dout,
                    const Tensor& dst,
                    const Tensor& dq,
                    const Tensor& dk,
                    const Tensor& dv,
                    const Tensor& dg,
                    const Tensor& dbeta,
                    const Tensor& ds0,
                    KdaOptions options,
                    const KdaSaved* saved) {
    constexpr std::string_view op = "kda_bwd";
    Packed p = pack_plan(options.doc_start, options.chunk_size, op);
    if (split_instead(p, options)) {
        MT_CHECK(saved == nullptr || saved->empty(),
                 "{}: saved holds kept tensors, but this call splits its documents (padding would grow the rows {} "
                 "times), which keeps nothing: they were kept by a forward with other options.doc_start or documents",
                 op,
                 p.plan.tp / std::max<int64_t>(p.plan.t, 1));
        return kda_bwd_documents(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options);
    }
    options.doc_start = Tensor();
    if (p.plan.one_document_per_row())
        return kda_bwd(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options, saved);
    // A KdaSaved of the packed rows: the same layout, then checked against the packed shapes by the call on them.
    KdaSaved inner;
    if (saved != nullptr && !saved->empty()) {
        MT_CHECK(saved->layout == layout_fingerprint(p.plan),
                 "{}: saved was kept by a forward over another document layout (options.doc_start) than this call's "
                 "({} packed tokens per row for {})",
                 op,
                 p.plan.tp,
                 p.plan.t);
        inner = *saved;
        inner.layout = 0;  // what the call on the packed rows (no doc_start) expects
    }
    upload_maps(p, q.device());
    options.chunk_reset = p.reset;
    const Tensor gq = packed_like(p, dq), gk = packed_like(p, dk), gv = packed_like(p, dv), gg = packed_like(p, dg),
                 gb = packed_like(p, dbeta);
    kda_bwd(pack(p, q),
            pack(p, k),
            pack(p, v),
            pack(p, g),
            pack(p, beta),
            s0,
            pack(p, dout),
            dst,
            gq,
            gk,
            gv,
            gg,
            gb,
            ds0,
            options,
            saved != nullptr ? &inner : nullptr);
    for (const auto& [full, part] : {std::pair{&dq, &gq}, {&dk, &gk}, {&dv, &gv}, {&dg, &gg}, {&dbeta, &gb}})
        unpack(p, *part, *full);
    note_packed(options);
}

}  // namespace

void kda_fwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& out,
             const Tensor& st,
             const KdaOptions& options,
             KdaSaved* saved) {
    constexpr std::string_view op = "kda_fwd";
    const core::Device device = check_same_device(
        op, {{"q", q}, {"k", k}, {"v", v}, {"g", g}, {"beta", beta}, {"s0", s0}, {"out", out}, {"st", st}});
    const cpu::KdaDims d = check_inputs(q, k, v, g, beta, s0, options, op);
    check_like(out, v, op, "out");
    check_optional_state(st, d, op, "st");
    if (options.doc_start.defined()) cpu::check_doc_start_map(options.doc_start, q, op, "options.doc_start");
    check_chunk_reset(options, d, device, op);
    MT_CHECK(!options.save_states_bf16 || (!options.save_states && !options.save_workspace),
             "{}: options.save_states_bf16 keeps the states alone; it does not combine with save_states or "
             "save_workspace",
             op);
    if (saved != nullptr) *saved = KdaSaved{};  // the CPU path and the split document path keep nothing
    const bool packed = options.doc_start.defined() && packs_documents(options, device, op);
    if (packed) return kda_fwd_packed(q, k, v, g, beta, s0, out, st, options, saved);
    if (device == core::Device::cuda) {
        check_cuda_algorithm(options, op);
        if (options.doc_start.defined()) return kda_fwd_documents(q, k, v, g, beta, s0, out, st, options);
        MT_CALL_KERNEL(kda_fwd, core::Device::cuda, q, k, v, g, beta, s0, out, st, options, saved);
        if (saved != nullptr && !saved->empty()) {
            saved->b = d.b;
            saved->seq = d.t;
            saved->hv = d.hv;
            saved->k = d.k;
            saved->v = d.v;
            saved->chunk = options.chunk_size;
        }
        return;
    }
    note_cpu_choice(options);
    if (options.doc_start.defined()) return kda_fwd_documents(q, k, v, g, beta, s0, out, st, options);
    MT_CALL_KERNEL(kda_fwd, core::Device::cpu, q, k, v, g, beta, s0, out, st, options, saved);
}

void kda_bwd(const Tensor& q,
             const Tensor& k,
             const Tensor& v,
             const Tensor& g,
             const Tensor& beta,
             const Tensor& s0,
             const Tensor& dout,
             const Tensor& dst,
             const Tensor& dq,
             const Tensor& dk,
             const Tensor& dv,
             const Tensor& dg,
             const Tensor& dbeta,
             const Tensor& ds0,
             const KdaOptions& options,
             const KdaSaved* saved) {
    constexpr std::string_view op = "kda_bwd";
    const core::Device device = check_same_device(op,
                                                  {{"q", q},
                                                   {"k", k},
                                                   {"v", v},
                                                   {"g", g},
                                                   {"beta", beta},
                                                   {"s0", s0},
                                                   {"dout", dout},
                                                   {"dst", dst},
                                                   {"dq", dq},
                                                   {"dk", dk},
                                                   {"dv", dv},
                                                   {"dg", dg},
                                                   {"dbeta", dbeta},
                                                   {"ds0", ds0}});
    const cpu::KdaDims d = check_inputs(q, k, v, g, beta, s0, options, op);
    check_like(dout, v, op, "dout");
    check_optional_state(dst, d, op, "dst");
    check_like(dq, q, op, "dq");
    check_like(dk, k, op, "dk");
    check_like(dv, v, op, "dv");
    check_like(dg, g, op, "dg");
    check_like(dbeta, beta, op, "dbeta");
    MT_CHECK(ds0.defined() == s0.defined(),
             "{}: ds0 is {} but s0 is {}; ds0 must be given exactly when s0 is",
             op,
             ds0.defined() ? "defined" : "undefined",
             s0.defined() ? "defined" : "undefined");
    check_optional_state(ds0, d, op, "ds0");
    if (options.doc_start.defined()) cpu::check_doc_start_map(options.doc_start, q, op, "options.doc_start");
    check_chunk_reset(options, d, device, op);
    // The packed path's KdaSaved has the packed rows' shapes: its own call on them checks it.
    if (options.doc_start.defined() && packs_documents(options, device, op))
        return kda_bwd_packed(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options, saved);
    if (saved != nullptr) check_saved(*saved, d, options, device, op);
    if (device == core::Device::cuda) {
        check_cuda_algorithm(options, op);
        if (options.doc_start.defined())
            return kda_bwd_documents(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options);
        return MT_CALL_KERNEL(
            kda_bwd, core::Device::cuda, q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options, saved);
    }
    note_cpu_choice(options);
    if (options.doc_start.defined())
        return kda_bwd_documents(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options);
    MT_CALL_KERNEL(
        kda_bwd, core::Device::cpu, q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options, saved);
}

uint64_t kda_packed_layout(const Tensor& doc_start, int64_t chunk) {
    constexpr std::string_view op = "kda_packed_layout";
    check_arg(doc_start, op, "doc_start", 2);
    MT_CHECK(doc_start.dtype() == DType::i32,
             "{}: doc_start has dtype {}, expected i32",
             op,
             core::dtype_name(doc_start.dtype()));
    MT_CHECK(chunk == 64 || chunk == 32, "{}: chunk = {}; the chunked algorithm takes 64 or 32", op, chunk);
    const Tensor host = doc_start.to_device(core::Device::cpu);
    cpu::check_doc_start_values(host, op, "doc_start");
    return layout_fingerprint(cpu::kda_pack_plan(host, chunk));
}

}  // namespace mt::ops
