// Tensor-core versions of the two sequential KDA scans (kda.md §4.5 step 6 and §4.6 step 3; the reverse one is in
// kda_rscan_tc.cu, the pieces they share in kda_scan_common.cuh), used for bf16 and f16 inputs when K % 16 == 0,
// K <= 128 and V % 16 == 0 (kda::use_tc). One block per (BV value columns, unit), chunks in order (or reverse), the
// fp32 state columns in the registers of the warps that own them and a TF32 copy in shared memory (RegState; the
// columns of S never mix). Each product is TF32
// mma.sync m16n8k8 with fp32 accumulation; the state update accumulates into the fp32 state itself
// (D = gamma * S + Kg^T Vn), so rounding enters only through the operands of each product.
//
// The value tile BV (16, 32, 64 or 128 columns) is picked per call (pick_bv): every block streams the chunk's whole
// W, Qg, Kg, A tiles (~112 KB of fp32) through shared memory whatever its BV, and at BV = 16 that stream and the
// steps' latencies, not the products, set the pace (~13k cycles per chunk at 8 x 4096 and at 1 x 32768 alike). A
// wider tile does more work per streamed byte, so the widest BV that still fills the GPU in one wave wins: 128 at
// B * HV = 128 units (one block per unit), 16 at 16 units. The per-chunk tiles are staged by cp.async and reloaded
// for the next chunk as soon as a step has consumed them, so the loads overlap the rest of the chunk.
//
// Deterministic and independent of BV: each output element has one owner lane, and its sum runs in a fixed order
// (the [c, BV] products as two interleaved chains over k, even and odd 8-steps, added at the end).
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/cuda/kda/kda_scan_common.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace {

// Forward shared memory (floats): W, Qg [c, ld_row(K)], Kg [c, ld_tr(K)], A [c, ld_row(c)], gamma-log [K],
// S rounded to TF32 and transposed [BV, ld_row(K)], Vn transposed [BV, ld_row(c)]: S and Vn are the B operands of
// the products, read transposed by frag_bt_x4. The fp32 state itself lives in the registers of the warps that
// own its tiles (state_tiles), and U goes straight to registers (each lane needs only its own outputs' values). (A
// runtime bv so pick_bv can size every tile.)
int scan_tc_floats(const Dims& d, int bv) {
    return 2 * d.c * ld_row(d.k) + d.c * ld_tr(d.k) + d.c * ld_row(d.c) + d.k + bv * (ld_row(d.k) + ld_row(d.c));
}
template <typename T, int BV, bool kModel>
__global__ void __launch_bounds__(kThreads, 1) scan_tc_kernel(const float* __restrict__ s0,
                                                              T* __restrict__ out,
                                                              float* __restrict__ st,
                                                              Dims dims,
                                                              Work w,
                                                              StatesOut so,
                                                              PhaseSums ps) {
    constexpr int kN = BV / 16;
    extern __shared__ __align__(16) float smem[];
    const Dims d = model_dims<kModel>(dims);
    const int c = d.c, kd = d.k, vd = d.v, tid = threadIdx.x;
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * BV;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int ldr = ld_row(kd), ldt = ld_tr(kd), lda = ld_row(c), lds = ld_row(kd), ldv = ld_row(c);
    float* sw = smem;             // W
    float* sq = sw + c * ldr;     // Qg
    float* sk = sq + c * ldr;     // Kg
    float* sa = sk + c * ldt;     // A
    float* sg = sa + c * lda;     // Gamma of the chunk's last row [K]
    float* ssr = sg + kd;         // the state columns rounded to TF32, transposed [BV, lds]
    float* svn = ssr + BV * lds;  // Vn transposed [BV, ldv], TF32-rounded
    const auto* svn_bits = reinterpret_cast<const uint32_t*>(svn);
    const auto* ssr_bits = reinterpret_cast<const uint32_t*>(ssr);
    // W, Qg, Kg and A arrive already rounded to TF32 (prep_tc), so their fragments are read as bits.
    const auto *sw_bits = reinterpret_cast<const uint32_t*>(sw), *sq_bits = reinterpret_cast<const uint32_t*>(sq);
    const auto *sk_bits = reinterpret_cast<const uint32_t*>(sk), *sa_bits = reinterpret_cast<const uint32_t*>(sa);
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    // Loads of chunk n in two groups: W and Qg (step 1), then A, Kg and Gamma's last row (steps 2 and 3), each
    // reissued for the next chunk once the barrier after its steps has passed.
    auto load_wq = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async<kThreads>(sw, ldr, w.w + ck_off(d, cb), kd, c, kd);
        stage_async<kThreads>(sq, ldr, w.qg + ck_off(d, cb), kd, c, kd);
    };
    auto load_ak = [&](int n) {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async<kThreads>(sa, lda, w.a + cc_off(d, cb), c, c, c);
        stage_async<kThreads>(sk, ldt, w.kg + ck_off(d, cb), kd, c, kd);
        stage_async<kThreads>(sg, kd, w.gam + ck_off(d, cb) + static_cast<int64_t>(c - 1) * kd, kd, 1, kd);
    };
    const int m0 = (warp & 3) * 16, nb = warp >> 2;
    const bool rows_on = m0 < c;
    // S as the B operand of steps 1 and 2, read as bits from its TF32 copy.
    // Lane offsets of the transposed S and Vn for frag_bt_x4: row_tile_product's B pairs, and (svn_k) the k-step
    // pairs of the state update.
    const int ssr_lane = bt_x4_lane(lds, b_pair_dn<kN>(), lane), svn_lane = bt_x4_lane(ldv, b_pair_dn<kN>(), lane);
    const int svn_k = bt_x4_lane(ldv, 0, lane);
    auto state_b = [&](uint32_t(&bb)[2][2], int k, int n0) { frag_bt_x4(bb, ssr_bits, ssr_lane, lds, k, n0); };
    // The fp32 state in its owner warps' registers, the TF32 copy in ssr (RegState).
    RegState<BV> sr(kd, warp, lane);
    sr.load(s0 != nullptr ? s0 + unit * kv + y0 : nullptr, vd);
    sr.write_copy_t(ssr, lds);
    // U at this lane's Vn outputs, loaded into registers one chunk ahead.
    float ur[kN][4];
    auto load_u = [&](int n) {
        if (!rows_on) return;
        const float* p = w.u + cv_off(d, chunk_index(d, unit, n)) + y0 + 2 * t;
#pragma unroll
        for (int i = 0; i < kN; ++i) {
            const int col = (nb + 2 * i) * 8;
            const float2 u0 = *reinterpret_cast<const float2*>(p + static_cast<int64_t>(m0 + g) * vd + col);
            const float2 u1 = *reinterpret_cast<const float2*>(p + static_cast<int64_t>(m0 + g + 8) * vd + col);
            ur[i][0] = u0.x;
            ur[i][1] = u0.y;
            ur[i][2] = u1.x;
            ur[i][3] = u1.y;
        }
    };
    // Step 1's tail: Vn = U - acc (acc = W S), into shared memory and the kept copy.
    auto store_vn = [&](const float(&acc)[2][kN][4], int64_t cb) {
        const int r0 = m0 + g;
#pragma unroll
        for (int i = 0; i < kN; ++i) {
            const int c0 = (nb + 2 * i) * 8 + 2 * t;
            // Vn is a TF32 operand wherever it is read (steps 2 and 3 here, by every warp; chunk_mm's products over
            // V), so it is rounded once here, in shared memory and in the fp32 kept copy alike. Only the general
            // chunk kernel (V % 32 != 0, no chunk_mm) reads it in fp32 loops, and gets the rounded values too
            // (~2^-11 relative, inside the TF32 rounding of the other operands there). The bf16 kept copy is rounded
            // from the TF32 value (rounding from fp32 instead kept four more registers live, which at BV = 128 made
            // the kernel spill; the two roundings differ by at most 2^-11 of the bf16 step).
            float vv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) vv[e] = tf32_bits(ur[i][e] - (acc[0][i][e] + acc[1][i][e]));
            svn[c0 * ldv + r0] = vv[0];
            svn[(c0 + 1) * ldv + r0] = vv[1];
            svn[c0 * ldv + r0 + 8] = vv[2];
            svn[(c0 + 1) * ldv + r0 + 8] = vv[3];
            auto keep = [&](auto* kept) {  // fp32 or bf16
                auto* p = kept + cv_off(d, cb) + y0 + c0;
                store_pair(p + static_cast<int64_t>(r0) * vd, vv[0], vv[1]);
                store_pair(p + static_cast<int64_t>(r0 + 8) * vd, vv[2], vv[3]);
            };
            if (so.vn != nullptr) keep(so.vn);
            if (so.vn16 != nullptr) keep(so.vn16);
        }
    };
    auto w_frag = [&](uint32_t(&a)[4], int k) { frag_a_ldsm(a, sw_bits, ldr, m0, k, lane); };
    auto q_frag = [&](uint32_t(&a)[4], int k) { frag_a_ldsm(a, sq_bits, ldr, m0, k, lane); };
    // Step 2's tail: O = acc + A Vn (acc = Qg S; A is zero above the diagonal: only k < m0 + 16), stored.
    auto finish_o = [&](float(&acc)[2][kN][4], int n) {
        row_tile_product(
            acc,
            0,
            m0 + 16,
            nb,
            [&](uint32_t(&a)[4], int k) { frag_a_ldsm(a, sa_bits, lda, m0, k, lane); },
            [&](uint32_t(&bb)[2][2], int k, int n0) { frag_bt_x4(bb, svn_bits, svn_lane, ldv, k, n0); });
#pragma unroll
        for (int i = 0; i < kN; ++i) {
            const int c0 = y0 + (nb + 2 * i) * 8 + 2 * t;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
                const int tok = n * c + m0 + g + 8 * h2;
                if (tok < d.t) {
                    T* p = out + v_row(d, b, tok, hv) + c0;
                    p[0] = from_f32<T>(acc[0][i][2 * h2] + acc[1][i][2 * h2]);
                    p[1] = from_f32<T>(acc[0][i][2 * h2 + 1] + acc[1][i][2 * h2 + 1]);
                }
            }
        }
    };
    // Step 3: S <- Diag(gamma) S + Kg^T Vn, accumulated into the fp32 state (registers), then its TF32 copy. No warp
    // reads the copy during step 3 (a barrier ends the products that read S), so it is rewritten in place.
    auto update_state = [&] {
        if (!sr.stl.on) return;
        sr.scale(expf(sg[sr.r0]), expf(sg[sr.r0 + 8]));
        for (int k0 = 0; k0 < c; k0 += 16) {
            uint32_t a[2][4];
            frag_at_f(a[0], sk_bits, ldt, sr.stl.x0, k0, g, t);
            frag_at_f(a[1], sk_bits, ldt, sr.stl.x0, k0 + 8, g, t);
            sr.each([&](int i, int c0) {
                uint32_t bb[2][2];
                frag_bt_x4(bb, svn_bits, svn_k, ldv, k0, c0 - 2 * t);
                mma_tf32(sr.s[i], a[0], bb[0]);
                mma_tf32(sr.s[i], a[1], bb[1]);
            });
        }
        sr.write_copy_t(ssr, lds);
    };
    // Three barriers per chunk: step 1 with step 2's first product (both read S), then O's tail with the state
    // update (both read Vn, neither S), then the loads. (Six before 2026-12-01, one per step and one per load wait.)
    load_wq(0);
    cp_async_commit();
    load_ak(0);
    cp_async_commit();
    load_u(0);
    ps.start();
    for (int n = 0; n < d.nc; ++n) {
        const int64_t cb = chunk_index(d, unit, n);
        const bool more = n + 1 < d.nc;
        // A document starts at chunk n (chunk_resets): its state starts from zero. Each owner warp clears its tiles
        // and their TF32 copy; no warp reads the copy between the barrier that ended chunk n - 1 and the one below.
        if (chunk_resets(d, w, unit, n)) {
            sr.clear();
            sr.write_copy_t(ssr, lds);
        }
        cp_async_wait<1>();
        __syncthreads();
        ps.add(1);
        if (so.hs != nullptr) sr.store(so.hs + cb * kv + y0, vd);
        if (so.hs16 != nullptr) sr.store(so.hs16 + cb * kv + y0, vd);
        // Step 1 with step 2's first product: Vn = U - W S, then Qg S into O's accumulators, which stay in registers
        // across the barrier that completes Vn. At BV <= 64 the two products share S's fragments (row_tile_product2);
        // at 128 their accumulators together would not fit in registers.
        float acc_o[2][kN][4] = {};
        if (rows_on) {
            float acc[2][kN][4] = {};
            if (out == nullptr) {
                row_tile_product(acc, 0, kd, nb, w_frag, state_b);
                store_vn(acc, cb);
            } else if constexpr (BV <= 64) {
                row_tile_product2(acc, acc_o, 0, kd, nb, w_frag, q_frag, state_b);
                store_vn(acc, cb);
            } else {
                row_tile_product(acc, 0, kd, nb, w_frag, state_b);
                store_vn(acc, cb);
                row_tile_product(acc_o, 0, kd, nb, q_frag, state_b);
            }
        }
        if (more) load_u(n + 1);
        cp_async_wait<0>();
        __syncthreads();
        ps.add(2);
        if (more) load_wq(n + 1);
        cp_async_commit();
        // Steps 2 and 3 read Vn, A, Kg and not S: one phase, two independent chains per warp.
        if (out != nullptr && rows_on) finish_o(acc_o, n);
        update_state();
        __syncthreads();
        ps.add(3);
        if (more) load_ak(n + 1);
        cp_async_commit();
        ps.add(4);
    }
    cp_async_wait<0>();
    if (st != nullptr) sr.store(st + unit * kv + y0, vd);
    ps.flush(5);
}

template <typename T, int BV>
void scan_bv(const float* s0, T* out, float* st, const Dims& d, const Work& w, const StatesOut& so) {
    const dim3 grid(static_cast<unsigned>(d.v / BV), static_cast<unsigned>(d.units()));
    const size_t smem = static_cast<size_t>(scan_tc_floats(d, BV)) * sizeof(float);
    // Phases (cycles per block, summed over its chunks): p1 wait for W/Qg, p2 Vn and Qg S (with the wait for
    // A/Kg), p3 O's tail and the state update, p4 load issue.
    const PhaseLog phases(out == nullptr ? "scan_bwd" : "scan", static_cast<int64_t>(grid.x) * grid.y);
    with_model_shape(d, [&](auto model) {
        const auto kernel = scan_tc_kernel<T, BV, decltype(model)::value>;
        set_smem(kernel, smem);
        kernel<<<grid, kThreads, smem, core::exec_stream()>>>(s0, out, st, d, w, so, {phases.clock().p});
    });
    phases.print(5);
}

}  // namespace

// The value tile of a scan: the BV in {16, 32, 64, 128} (up to max_bv, dividing V, its shared memory within the
// device's limit) of least modelled time, waves * (256 + BV): one block per SM (the chunk tiles take most of the
// shared memory at every BV), and a chunk step costing a fixed ~256 columns' worth (the ~112 KB tile stream and the
// step's latency) plus BV columns of products. `forced` (16, 32, 64 or 128; ops::KdaKernels) is taken where it fits.
int pick_bv(const Dims& d, int forced, int (*floats)(const Dims&, int)) {
    // Properties of the process's one device, asked once (make_plan runs pick_bv twice per KDA call).
    static const int sms = device_attr(cudaDevAttrMultiProcessorCount);
    static const int smem_max = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    auto fits = [&](int bv) { return d.v % bv == 0 && floats(d, bv) * static_cast<int>(sizeof(float)) <= smem_max; };
    if ((forced == 16 || forced == 32 || forced == 64 || forced == 128) && fits(forced)) return forced;
    int best = kBV;
    int64_t best_cost = INT64_MAX;
    for (int bv = kBV; bv <= 128; bv *= 2) {
        if (!fits(bv)) continue;
        const int64_t blocks = static_cast<int64_t>(d.units()) * (d.v / bv);
        const int64_t cost = (blocks + sms - 1) / sms * (256 + bv);
        if (cost < best_cost) {
            best = bv;
            best_cost = cost;
        }
    }
    return best;
}

int device_attr(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}

bool tc_shapes(const Dims& d, DType dt) {
    return dt != DType::f32 && d.k % 16 == 0 && d.k <= 128 && d.v % kBV == 0;
}

int scan_tile(const Dims& d, int forced) {
    return pick_bv(d, forced, scan_tc_floats);
}

void scan_tc_launch(DType dt,
                    const Tensor& s0,
                    const Tensor& out,
                    const Tensor& st,
                    const Dims& d,
                    const Work& w,
                    const StatesOut& states,
                    int bv) {
    const float* s0p = s0.defined() ? s0.data<float>() : nullptr;
    float* stp = st.defined() ? st.data<float>() : nullptr;
    MT_CUDA_DISPATCH(dt, T, {
        T* op = out.defined() ? static_cast<T*>(out.raw()) : nullptr;
        if constexpr (std::is_same_v<T, float>) {
            MT_CHECK(false, "kda scan_tc: f32 inputs take the fp32 scan");
        } else {
            with_bv(bv, [&](auto tile) { scan_bv<T, decltype(tile)::value>(s0p, op, stp, d, w, states); });
        }
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::ops::cuda::kda
