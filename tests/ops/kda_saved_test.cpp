// ops::KdaSaved, what kda_fwd keeps for kda_bwd (ops/kda.h, kda.md §4.6): on the GPU the backward that reads the
// kept tiles (A, M, T), the one that also reads the kept states (hs, Vn) and the one that reads everything (Gamma,
// Qg, Kg, W too) must return exactly, bit for bit, what the recomputing backward returns, for the bounded gate and for
// the softplus gate (whose chunks take the pairwise fallback paths), chunk 64 and 32, GVA and an initial state. The
// bf16 states alone (save_states_bf16) change the gradients' rounding, so they are held to the bf16 parity budget
// against the f64 CPU reference instead, and must differ from the recomputing backward's (they were read). On the
// CPU a KdaSaved stays empty; one that does not fit the call is an error naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "kda_inputs.h"
#include "op_harness.h"
#include "ops/kda.h"
#include "support/documents.h"

namespace mt::ops::test {
namespace {

enum class Keep { nothing, tiles, states, all, states_bf16 };

// Forward and backward of bf16 (or f16: half) inputs on the GPU; the results come back to the host as f32. On the
// CPU (the reference): the same rounded inputs in f64.
std::vector<std::pair<std::string, Tensor>> run_gpu(const KdaInputs& in,
                                                    KdaOptions options,
                                                    Keep keep,
                                                    core::Device device = core::Device::cuda,
                                                    DType half = DType::bf16) {
    const bool cpu = device == core::Device::cpu;
    auto dev = [&](const Tensor& t, DType dt) {
        if (!t.defined()) return t;
        return cpu ? t.to(dt).to(DType::f64) : t.to(dt).to_device(device);
    };
    const DType bf = half, act = cpu ? DType::f64 : bf, state = cpu ? DType::f64 : DType::f32;
    const Tensor q = dev(in.q, bf), k = dev(in.k, bf), v = dev(in.v, bf), g = dev(in.g, bf), beta = dev(in.beta, bf);
    const Tensor s0 = dev(in.s0, DType::f32);
    const int64_t b = q.size(0), hv = v.size(2), kd = q.size(3), vd = v.size(3);
    const Tensor out = Tensor::zeros(v.shape(), act, device);
    const Tensor st = Tensor::zeros({b, hv, kd, vd}, state, device);
    options.save_states = keep == Keep::states;
    options.save_workspace = keep == Keep::all;
    options.save_states_bf16 = keep == Keep::states_bf16;
    KdaSaved saved;
    kda_fwd(q, k, v, g, beta, s0, out, st, options, keep == Keep::nothing ? nullptr : &saved);
    if (keep == Keep::states_bf16) {
        // Kept where the backward's products over V run on tensor cores (V % 32 == 0), else nothing.
        EXPECT_EQ(saved.has_bf16_states(), vd % 32 == 0);
        EXPECT_FALSE(saved.has_tiles());
        if (saved.has_states()) {
            EXPECT_EQ(saved.hs.dtype(), DType::bf16);
            EXPECT_EQ(saved.vn.dtype(), DType::bf16);
        }
    } else if (keep != Keep::nothing) {
        EXPECT_TRUE(saved.has_tiles());
        EXPECT_EQ(saved.has_states(), keep == Keep::states || keep == Keep::all);
        EXPECT_EQ(saved.has_workspace(), keep == Keep::all);
    }
    const Tensor dout = dev(op_randn(v.shape(), 7, 10), bf), dst = dev(op_randn(st.shape(), 7, 11), DType::f32);
    auto zeros = [&](const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), device); };
    const Tensor dq = zeros(q), dk = zeros(k), dv = zeros(v), dg = zeros(g), dbeta = zeros(beta);
    const Tensor ds0 = s0.defined() ? zeros(s0) : Tensor();
    kda_bwd(q, k, v, g, beta, s0, dout, dst, dq, dk, dv, dg, dbeta, ds0, options, &saved);
    std::vector<std::pair<std::string, Tensor>> r = {
        {"out", out}, {"st", st}, {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}, {"dbeta", dbeta}};
    if (ds0.defined()) r.push_back({"ds0", ds0});
    for (auto& [name, t] : r) t = t.to(DType::f32).to_device(core::Device::cpu);
    return r;
}

void expect_identical(const std::vector<std::pair<std::string, Tensor>>& a,
                      const std::vector<std::pair<std::string, Tensor>>& b,
                      const std::string& what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        const Tensor &x = a[i].second, &y = b[i].second;
        ASSERT_EQ(x.numel(), y.numel());
        int64_t differ = 0;
        for (int64_t e = 0; e < x.numel(); ++e) differ += core::tensor_get_flat(x, e) != core::tensor_get_flat(y, e);
        EXPECT_EQ(differ, 0) << what << ": " << a[i].first << " differs in " << differ << " of " << x.numel()
                             << " elements";
    }
}

struct SavedCase {
    KdaShape shape;
    KdaOptions options;
    KdaGateRegime regime;
    bool s0;
};

TEST(GpuKdaSaved, KeptTilesAndStatesGiveTheRecomputedResultsExactly) {
    if (!op_gpu_available()) GTEST_SKIP() << kOpNoGpuMessage;
    const SavedCase cases[] = {
        {{2, 300, 2, 4, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 64}, KdaGateRegime::bounded, true},
        {{1, 150, 1, 1, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 32}, KdaGateRegime::floor, false},
        {{1, 100, 1, 2, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::pairwise, 64}, KdaGateRegime::softplus, true},
        {{1, 90, 1, 1, 32, 48}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 32}, KdaGateRegime::bounded, false},
    };
    for (const SavedCase& c : cases) {
        const KdaInputs in = kda_make_inputs(c.shape, c.regime, c.s0, 41);
        const std::string what = "T = " + std::to_string(c.shape.t) + ", K = " + std::to_string(c.shape.k) +
                                 ", chunk " + std::to_string(c.options.chunk_size);
        const auto base = run_gpu(in, c.options, Keep::nothing);
        for (const auto& [name, t] : base) EXPECT_TRUE(kda_all_finite(t)) << what << ": " << name;
        expect_identical(base, run_gpu(in, c.options, Keep::tiles), what + ", tiles kept");
        expect_identical(base, run_gpu(in, c.options, Keep::states), what + ", tiles and states kept");
        expect_identical(base, run_gpu(in, c.options, Keep::all), what + ", everything kept");
    }
}

// The states alone in bf16 (save_states_bf16): the forward's results are those of a forward that keeps nothing, the
// gradients stay within the bf16 parity budget (kda.md 8.6) of the f64 CPU reference and differ from the recomputing
// backward's (which reads fp32 states): the kept states were read. V = 48 keeps nothing (no products over V on tensor
// cores there) and gives the recomputed results exactly. The last case runs f16 inputs (bf16 states all the same).
TEST(GpuKdaSaved, Bf16StatesStayWithinTheParityBudget) {
    if (!op_gpu_available()) GTEST_SKIP() << kOpNoGpuMessage;
    const SavedCase cases[] = {
        {{2, 300, 2, 4, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 64}, KdaGateRegime::bounded, true},
        {{1, 150, 1, 1, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 32}, KdaGateRegime::floor, false},
        {{1, 100, 1, 2, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::pairwise, 64}, KdaGateRegime::softplus, true},
        {{1, 130, 1, 1, 32, 64}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 64}, KdaGateRegime::bounded, true},
        {{1, 90, 1, 1, 32, 48}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 32}, KdaGateRegime::bounded, false},
        {{1, 200, 1, 2, 128, 128}, {KdaAlgorithm::chunked, KdaDiagonal::matmul, 64}, KdaGateRegime::bounded, true},
    };
    const size_t f16_case = std::size(cases) - 1;
    for (size_t ci = 0; ci < std::size(cases); ++ci) {
        const SavedCase& c = cases[ci];
        const DType half = ci == f16_case ? DType::f16 : DType::bf16;
        const KdaInputs in = kda_make_inputs(c.shape, c.regime, c.s0, 47);
        const std::string what = std::string(core::dtype_name(half)) + " T = " + std::to_string(c.shape.t) +
                                 ", K = " + std::to_string(c.shape.k) + ", V = " + std::to_string(c.shape.v) +
                                 ", chunk " + std::to_string(c.options.chunk_size);
        const core::Device gpu = core::Device::cuda;
        const auto base = run_gpu(in, c.options, Keep::nothing, gpu, half);
        const auto got = run_gpu(in, c.options, Keep::states_bf16, gpu, half);
        if (c.shape.v % 32 != 0) {
            expect_identical(base, got, what + ", nothing kept at V % 32 != 0");
            continue;
        }
        const auto ref = run_gpu(in, c.options, Keep::nothing, core::Device::cpu, half);
        ASSERT_EQ(got.size(), ref.size());
        expect_identical({base[0], base[1]}, {got[0], got[1]}, what + ", the forward's out and st");
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const std::string name = got[i].first;
            // dg's errors are heavy-tailed (a reverse cumsum) as in the KDA parity cases (kda_test.cpp): its max-abs
            // factor is theirs, 40, and its rms floor 1e-3.
            const bool dg = name == "dg";
            op_expect_parity("GpuKdaSaved.Bf16States",
                             what + " " + name,
                             got[i].second,
                             ref[i].second,
                             1e-2,
                             dg ? 1e-3 : 1e-6,
                             dg ? 40.0 : kMaxAbsFactor);
            if (i < 2) continue;
            for (int64_t e = 0; e < got[i].second.numel(); ++e)
                differ += core::tensor_get_flat(got[i].second, e) != core::tensor_get_flat(base[i].second, e);
        }
        EXPECT_GT(differ, 0) << what << ": every gradient equals the recomputing backward's: the bf16 states were "
                             << "not read";
    }
}

// The backward reads what was kept (a changed T changes the gradients) and only reads it (the kept tensors are
// unchanged afterwards, and a second backward from them returns the same gradients).
TEST(GpuKdaSaved, BackwardOnlyReadsWhatWasKeptAndUsesIt) {
    if (!op_gpu_available()) GTEST_SKIP() << kOpNoGpuMessage;
    const KdaInputs in = kda_make_inputs({1, 150, 1, 2, 128, 128}, KdaGateRegime::bounded, true, 43);
    auto dev = [](const Tensor& t, DType dt) { return t.to(dt).to_device(core::Device::cuda); };
    const DType bf = DType::bf16;
    const Tensor q = dev(in.q, bf), k = dev(in.k, bf), v = dev(in.v, bf), g = dev(in.g, bf), beta = dev(in.beta, bf);
    const Tensor s0 = dev(in.s0, DType::f32), out = Tensor::zeros(v.shape(), bf, core::Device::cuda);
    KdaOptions options;
    options.save_workspace = true;
    KdaSaved saved;
    kda_fwd(q, k, v, g, beta, s0, out, Tensor(), options, &saved);
    ASSERT_TRUE(saved.has_workspace());
    EXPECT_EQ(saved.seq, 150);
    EXPECT_EQ(saved.chunk, 64);
    const std::vector<const Tensor*> kept = {
        &saved.a, &saved.m, &saved.t, &saved.hs, &saved.vn, &saved.gam, &saved.qg, &saved.kg, &saved.w};
    std::vector<Tensor> before;
    for (const Tensor* t : kept) before.push_back(t->to_device(core::Device::cpu));
    const Tensor dout = dev(op_randn(v.shape(), 7, 10), bf);
    auto backward = [&](const KdaSaved& s) {
        auto zeros = [](const Tensor& t) { return Tensor::zeros(t.shape(), t.dtype(), core::Device::cuda); };
        const Tensor dq = zeros(q), dk = zeros(k), dv = zeros(v), dg = zeros(g), db = zeros(beta), ds0 = zeros(s0);
        kda_bwd(q, k, v, g, beta, s0, dout, Tensor(), dq, dk, dv, dg, db, ds0, options, &s);
        std::vector<std::pair<std::string, Tensor>> r = {
            {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}, {"dbeta", db}, {"ds0", ds0}};
        for (auto& [name, t] : r) t = t.to(DType::f32).to_device(core::Device::cpu);
        return r;
    };
    const auto first = backward(saved);
    for (size_t i = 0; i < kept.size(); ++i)
        expect_identical({{"kept", before[i]}},
                         {{"kept", kept[i]->to_device(core::Device::cpu)}},
                         "kept tensor " + std::to_string(i) + " after the backward");
    expect_identical(first, backward(saved), "second backward");
    // A copy of T with every 65th entry doubled (T's diagonal in the first chunk among them): dk goes through
    // dXw = T^T dW, so it must change.
    KdaSaved changed = saved;
    const Tensor t_host = saved.t.to_device(core::Device::cpu);
    std::vector<float> host(static_cast<size_t>(t_host.numel()));
    for (int64_t e = 0; e < t_host.numel(); ++e)
        host[e] = static_cast<float>(core::tensor_get_flat(t_host, e)) * (e % 65 == 0 ? 2.0f : 1.0f);
    changed.t = Tensor::borrow(host.data(), t_host.shape(), DType::f32).to_device(core::Device::cuda);
    const auto other = backward(changed);
    double diff = 0.0;
    for (int64_t e = 0; e < first[1].second.numel(); ++e)
        diff += std::abs(core::tensor_get_flat(first[1].second, e) - core::tensor_get_flat(other[1].second, e));
    EXPECT_GT(diff, 0.0) << "dk did not change with the kept T: the backward did not read it";
}

TEST(KdaSaved, CpuKeepsNothing) {
    const KdaInputs in = kda_make_inputs({1, 20, 1, 1, 4, 3}, KdaGateRegime::bounded, false, 3);
    KdaSaved saved;
    saved.t = Tensor::zeros({4}, DType::f32);  // cleared by the forward
    const Tensor out = op_like(in.v);
    kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), {}, &saved);
    EXPECT_FALSE(saved.has_tiles());
    EXPECT_FALSE(saved.has_states());
    const Tensor dq = op_like(in.q), dk = op_like(in.k), dv = op_like(in.v), dg = op_like(in.g);
    const Tensor db = op_like(in.beta);
    kda_bwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), dq, dk, dv, dg, db, Tensor(), {}, &saved);
    EXPECT_TRUE(kda_all_finite(dq));
}

TEST(OpArgs, KdaSavedThatDoesNotFit) {
    const KdaInputs in = kda_make_inputs({1, 70, 1, 2, 4, 3}, KdaGateRegime::bounded, false, 3);
    const Tensor out = op_like(in.v), dq = op_like(in.q), dk = op_like(in.k), dv = op_like(in.v);
    const Tensor dg = op_like(in.g), db = op_like(in.beta);
    auto bwd = [&](const KdaSaved& s) {
        kda_bwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), dq, dk, dv, dg, db, Tensor(), {}, &s);
    };
    // Per tile tensor B * HV * nc * C * C = 1 * 2 * 2 * 64 * 64 elements; per row tensor B * HV * nc * C * K.
    const Tensor tile = Tensor::zeros({2 * 2 * 64 * 64}, DType::f32),
                 rows = Tensor::zeros({2 * 2 * 64 * 4}, DType::f32);
    auto tiles = [&](const Tensor& a, const Tensor& m, const Tensor& t) {
        KdaSaved s;
        s.a = a;
        s.m = m;
        s.t = t;
        s.b = 1, s.seq = 70, s.hv = 2, s.k = 4, s.v = 3, s.chunk = 64;  // what kda_fwd would record
        return s;
    };
    bwd(tiles(tile, tile, tile));  // fits
    KdaSaved other_t = tiles(tile, tile, tile);
    other_t.seq = 100;  // the same number of chunks, so every tensor's size fits: caught by the recorded shapes
    expect_op_error([&] { bwd(other_t); },
                    "kda_bwd: saved was kept by a kda_fwd of B = 1, T = 100, HV = 2, K = 4, V = 3, chunk 64; this call "
                    "has B = 1, T = 70, HV = 2, K = 4, V = 3, chunk 64");
    expect_op_error([&] { bwd(tiles(tile, tile, Tensor::zeros({64 * 64}, DType::f32))); },
                    "kda_bwd: saved.t has 4096 elements, expected 16384 for B = 1, T = 70, HV = 2, K = 4, V = 3, "
                    "chunk 64; it was saved by a kda_fwd of other shapes");
    expect_op_error([&] { bwd(tiles(tile, tile, tile.to(DType::f64))); },
                    "kda_bwd: saved.t must be a contiguous, 16-byte aligned f32 tensor on the inputs' device");
    expect_op_error([&] { bwd(tiles(tile, Tensor(), tile)); },
                    "kda_bwd: saved.a, saved.m and saved.t must be all defined or all undefined");
    // Without the tiles the states must be bf16 (save_states_bf16), and they come in pairs.
    const Tensor state = Tensor::zeros({2 * 2 * 4 * 3}, DType::f32), vn = Tensor::zeros({2 * 2 * 64 * 3}, DType::f32);
    KdaSaved states_only;
    states_only.hs = state;
    states_only.vn = vn;
    states_only.b = 1, states_only.seq = 70, states_only.hv = 2, states_only.k = 4, states_only.v = 3;
    states_only.chunk = 64;
    expect_op_error([&] { bwd(states_only); },
                    "kda_bwd: saved.hs must be a contiguous, 16-byte aligned bf16 tensor on the inputs' device (bf16 "
                    "without the tiles: f32 states come only with saved.a, saved.m and saved.t)");
    states_only.hs = state.to(DType::bf16);
    states_only.vn = vn.to(DType::bf16);
    bwd(states_only);  // fits (the CPU reads none of it)
    states_only.vn = Tensor();
    expect_op_error([&] { bwd(states_only); }, "kda_bwd: saved.hs and saved.vn come together");
    // Beside the tiles the states are f32; bf16 states there are an error.
    KdaSaved mixed = tiles(tile, tile, tile);
    mixed.hs = state.to(DType::bf16);
    mixed.vn = vn.to(DType::bf16);
    expect_op_error([&] { bwd(mixed); },
                    "kda_bwd: saved.hs must be a contiguous, 16-byte aligned f32 tensor on the inputs' device (f32 "
                    "beside the tiles)");
    // A states-only KdaSaved of another T with the same number of chunks: caught by the recorded shapes.
    states_only.vn = vn.to(DType::bf16);
    states_only.seq = 100;
    expect_op_error([&] { bwd(states_only); }, "kda_bwd: saved was kept by a kda_fwd of B = 1, T = 100");
    KdaSaved rows_only = tiles(tile, tile, tile);
    rows_only.gam = rows_only.qg = rows_only.kg = rows_only.w = rows;
    expect_op_error([&] { bwd(rows_only); },
                    "kda_bwd: saved.gam, saved.qg, saved.kg and saved.w come together, and only with the tiles and "
                    "the states");
    KdaOptions both;
    both.save_states = both.save_states_bf16 = true;
    expect_op_error([&] { kda_fwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), both); },
                    "kda_fwd: options.save_states_bf16 keeps the states alone; it does not combine with save_states "
                    "or save_workspace");
}

// Under document masking the packed path's KdaSaved records its layout (KdaSaved::layout): the backward refuses one
// kept for another document map that packs to the same length, and a packed one given to a call without documents.
TEST(OpArgs, KdaSavedOfAnotherDocumentLayout) {
    const int64_t t = 128;
    const KdaInputs in = kda_make_inputs({1, t, 1, 1, 4, 3}, KdaGateRegime::bounded, false, 5);
    const Tensor out = op_like(in.v), dq = op_like(in.q), dk = op_like(in.k), dv = op_like(in.v);
    const Tensor dg = op_like(in.g), db = op_like(in.beta);
    KdaOptions options;
    options.documents = KdaDocuments::packed;
    options.doc_start = mt::testing::doc_start_map({{0, 10}}, t);   // 10 + 118 tokens: 64 + 128 packed
    const Tensor other = mt::testing::doc_start_map({{0, 20}}, t);  // 20 + 108: 64 + 128 packed as well
    EXPECT_NE(kda_packed_layout(options.doc_start, 64), kda_packed_layout(other, 64));
    auto bwd = [&](const KdaOptions& o, const KdaSaved& s) {
        kda_bwd(in.q, in.k, in.v, in.g, in.beta, Tensor(), out, Tensor(), dq, dk, dv, dg, db, Tensor(), o, &s);
    };
    // bf16 states of the packed rows (B * HV * nc = 3 chunks of 64), as a packed forward on the GPU keeps them.
    KdaSaved s;
    s.hs = Tensor::zeros({3 * 4 * 3}, DType::bf16);
    s.vn = Tensor::zeros({3 * 64 * 3}, DType::bf16);
    s.b = 1, s.seq = 192, s.hv = 1, s.k = 4, s.v = 3, s.chunk = 64;
    s.layout = kda_packed_layout(other, 64);
    expect_op_error([&] { bwd(options, s); },
                    "kda_bwd: saved was kept by a forward over another document layout (options.doc_start) than this "
                    "call's (192 packed tokens per row for 128)");
    s.layout = kda_packed_layout(options.doc_start, 64);
    bwd(options, s);  // fits (the CPU reads none of it)
    KdaOptions plain;
    expect_op_error([&] { bwd(plain, s); },
                    "kda_bwd: saved was kept by a forward over packed documents (options.doc_start); this call has no "
                    "document map");
    expect_op_error(
        [&] {
            kda_packed_layout(Tensor::zeros({1, 4}, DType::f32), 64);
        },
        "kda_packed_layout: doc_start has dtype f32, expected i32");
}

}  // namespace
}  // namespace mt::ops::test
