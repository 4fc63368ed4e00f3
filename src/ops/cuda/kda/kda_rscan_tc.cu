// The reverse KDA scan on tensor cores (kda.md §4.6 step 3), for the inputs kda::use_tc accepts: one block per
// (BV value columns, unit), chunks last to first, dS columns in fp32 shared memory (at BV 32 and 64 in registers,
// with a TF32 copy in shared memory: fused_rscan), TF32 mma.sync m16n8k8 with fp32 accumulation. The value tile comes
// from pick_bv (kda_scan_common.cuh) as for the forward scan (kda_scan_tc.cu, whose header comment explains the
// choice); deterministic and independent of BV in the same way.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/cuda/kda/kda_scan_common.cuh"
#include "ops/kda.h"

namespace mt::ops::cuda::kda {

namespace {

// Whether the reverse scan keeps dS in registers and computes step 2's Qg^T dO in step 1's phase (see the kernel).
// At BV = 128 the registers hold Qg and W's fragments and two passes of accumulators instead. At BV = 16 it measured
// slower (2.32 -> 2.81 ms at 1 x 32768: its step 1 is too short to hide the global loads of Qg and W's fragments,
// which it needs in its own phase; loading them a chunk ahead instead, at the end of step 2, took 4.3 ms, queued
// behind the tile copies), at BV = 32 faster (7.25 -> 6.83 ms at 2 x 65536).
__host__ __device__ constexpr bool fused_rscan(int bv) {
    return bv == 32 || bv == 64;
}

// Shared memory (floats): Kg [c, ld_row(K)], A [c, ld_tr(c)], gamma-log [2][K], dS [K, ld_b] (fused_rscan: its
// TF32 copy, transposed [BV, ld_row(K)], for frag_bt_x4), dVn [c, ld_b], and two 16-bit dO buffers [c, ld_b] (dO
// of the next chunk streams in while this one is used). Qg and W go to registers.
__host__ __device__ inline int ds_floats(const Dims& d, int bv) {
    const int rows = d.k * (bv + 8), cols = bv * ld_row(d.k);
    return fused_rscan(bv) && cols > rows ? cols : rows;
}
int rscan_tc_floats(const Dims& d, int bv) {
    return d.c * ld_row(d.k) + d.c * ld_tr(d.c) + 2 * d.k + ds_floats(d, bv) + 2 * d.c * (bv + 8);
}

// One block's (BV value columns, unit) of rscan_tc_kernel, kda.md §4.6 step 3 (the reverse scan, last chunk first):
// its indices, shared-memory tiles and loads, and the two per-chunk products, dVn (dvn_step) and the dS update
// (state_terms); scan_fused and scan_smem are the chunk loop with dS in registers (fused_rscan) or in shared memory.
// Every member is inlined into the kernel, so the split into phases costs nothing at run time.
template <typename T, int BV, bool kModel>
struct Rscan {
    static constexpr int ld = ld_b<BV>(), kN = BV / 16, kSteps = kMaxChunk / 8;
    const Dims d;
    const Work& w;
    const T* const dout;
    float* const dvns;
    const int c, kd, vd, tid;
    const int unit, b, hv, y0;
    const int warp, lane, g, t;
    const int ldr, lda;
    float* const sk;    // Kg (row reads)
    float* const sa;    // A (transposed reads)
    float* const sg;    // Gamma of the last row, two buffers [2][K]
    float* const sds;   // dS [K, ld]
    float* const sdvn;  // -dVn [c, ld], TF32-rounded
    T* const sdo0;      // dO, two buffers [c, ld] (16-bit)
    const uint32_t* const sdvn_bits;
    // Kg, A (and Qg, W) arrive already rounded to TF32 (prep_tc), so their fragments are read as bits.
    const uint32_t *const sk_bits, *const sa_bits;
    const int64_t kv;
    const int m0, nb;
    const bool rows_on;
    const StateTiles stl;
    const int last;

    __device__ __forceinline__ Rscan(float* smem, const Dims& dims, const Work& work, const T* dout_, float* dvns_)
        : d(model_dims<kModel>(dims)),
          w(work),
          dout(dout_),
          dvns(dvns_),
          c(d.c),
          kd(d.k),
          vd(d.v),
          tid(threadIdx.x),
          unit(blockIdx.y),
          b(unit / d.hv),
          hv(unit % d.hv),
          y0(blockIdx.x * BV),
          warp(tid / 32),
          lane(tid % 32),
          g(lane / 4),
          t(lane % 4),
          ldr(ld_row(kd)),
          lda(ld_tr(c)),
          sk(smem),
          sa(sk + c * ldr),
          sg(sa + c * lda),
          sds(sg + 2 * kd),
          sdvn(sds + ds_floats(d, BV)),
          sdo0(reinterpret_cast<T*>(sdvn + c * ld)),
          sdvn_bits(reinterpret_cast<const uint32_t*>(sdvn)),
          sk_bits(reinterpret_cast<const uint32_t*>(sk)),
          sa_bits(reinterpret_cast<const uint32_t*>(sa)),
          kv(static_cast<int64_t>(kd) * vd),
          m0((warp & 3) * 16),
          nb(warp >> 2),
          rows_on(m0 < c),
          stl(state_tiles(kd, warp)),
          last(d.nc - 1) {}

    // Kg, A and Gamma's last row of chunk n into shared memory (cp.async, uncommitted).
    __device__ __forceinline__ void load_ka(int n) const {
        const int64_t cb = chunk_index(d, unit, n);
        stage_async<kThreads>(sk, ldr, w.kg + ck_off(d, cb), kd, c, kd);
        stage_async<kThreads>(sa, lda, w.a + cc_off(d, cb), c, c, c);
        stage_async<kThreads>(
            sg + (n & 1) * kd, kd, w.gam + ck_off(d, cb) + static_cast<int64_t>(c - 1) * kd, kd, 1, kd);
    }
    __device__ __forceinline__ T* sdo(int n) const {
        return sdo0 + (n & 1) * c * ld;
    }
    // dO of chunk n (this block's BV columns) into its buffer, zeros past T (cp.async, uncommitted).
    __device__ __forceinline__ void load_do(int n) const {
        constexpr int per = BV / 8;  // 16-byte copies per row
        T* dstp = sdo(n);
        for (int e = tid; e < c * per; e += kThreads) {
            const int r = e / per, y = (e % per) * 8, tok = n * c + r;
            const bool ok = tok < d.t;
            cp_async16_zfill(dstp + r * ld + y, dout + v_row(d, b, ok ? tok : 0, hv) + y0 + y, ok);
        }
    }

    // This warp's A fragments of step 2 (Qg^T and W^T at its state rows), as fp32: loaded once step 1's accumulators
    // are dead (loading them a chunk ahead spilled at BV = 128), or with fused_rscan as the chunk starts.
    __device__ __forceinline__ void load_qw(int n, float (&qf)[kSteps][4], float (&wf)[kSteps][4]) const {
        if (!stl.on) return;
        const int64_t o = ck_off(d, chunk_index(d, unit, n)) + stl.x0 + g;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            if (s * 8 >= c) continue;
            const int64_t r0 = o + static_cast<int64_t>(s * 8 + t) * kd, r1 = r0 + 4 * kd;
            qf[s][0] = __ldg(w.qg + r0);
            qf[s][1] = __ldg(w.qg + r0 + 8);
            qf[s][2] = __ldg(w.qg + r1);
            qf[s][3] = __ldg(w.qg + r1 + 8);
            wf[s][0] = __ldg(w.w + r0);
            wf[s][1] = __ldg(w.w + r0 + 8);
            wf[s][2] = __ldg(w.w + r1);
            wf[s][3] = __ldg(w.w + r1 + 8);
        }
    }

    // kda.md §4.6 step 3, dVn = A^T dO + Kg dS (A^T dO is step 2's part; A^T is zero below the diagonal: only
    // k >= m0), dS's B fragments by ds_frag; -dVn goes to shared memory rounded once (the B operand of the dS
    // update for every warp), dVn to dvns exact.
    template <typename DsFrag>
    __device__ __forceinline__ void dvn_step(const T* so, int64_t cb, DsFrag&& ds_frag) const {
        if (!rows_on) return;
        float acc[2][kN][4] = {};
        row_tile_product(
            acc,
            m0,
            c,
            nb,
            [&](uint32_t(&a)[4], int k) { frag_at_f(a, sa_bits, lda, m0, k, g, t); },
            [&](uint32_t(&bb)[2][2], int k, int n0) {
                b_pair_frags<kN>(
                    bb, k, n0, [&](uint32_t(&b1)[2], int kk, int nn) { frag_b16(b1, so, ld, kk, nn, g, t); });
            });
        row_tile_product(
            acc, 0, kd, nb, [&](uint32_t(&a)[4], int k) { frag_a_ldsm(a, sk_bits, ldr, m0, k, lane); }, ds_frag);
        const int r0 = m0 + g;
#pragma unroll
        for (int i = 0; i < kN; ++i) {
            const int c0 = (nb + 2 * i) * 8 + 2 * t;
            float vv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) vv[e] = acc[0][i][e] + acc[1][i][e];
            *reinterpret_cast<float2*>(sdvn + r0 * ld + c0) = make_float2(tf32_bits(-vv[0]), tf32_bits(-vv[1]));
            *reinterpret_cast<float2*>(sdvn + (r0 + 8) * ld + c0) = make_float2(tf32_bits(-vv[2]), tf32_bits(-vv[3]));
            float* p = dvns + cv_off(d, cb) + y0 + c0;
            *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0) * vd) = make_float2(vv[0], vv[1]);
            *reinterpret_cast<float2*>(p + static_cast<int64_t>(r0 + 8) * vd) = make_float2(vv[2], vv[3]);
        }
    }

    // kda.md §4.6 step 3, the dS update's two sums over the chunk's rows for this warp's state tiles (column tile
    // of tile i: tile_n0(i)), in this order at every BV: acc += Qg^T dO (qg_terms), then acc -= W^T dVn (w_terms;
    // sdvn holds -dVn). The A fragments come from registers (af: qf or wf, TF32 already: prep_tc rounds Qg and W),
    // the B fragments by b_frag.
    template <typename Acc, typename TileN0, typename BFrag>
    __device__ __forceinline__ void state_terms(Acc& acc,
                                                const float (&af)[kSteps][4],
                                                TileN0&& tile_n0,
                                                BFrag&& b_frag) const {
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
            if (s * 8 >= c) continue;
            uint32_t a[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = __float_as_uint(af[s][e]);
#pragma unroll
            for (int i = 0; i < static_cast<int>(sizeof(acc) / sizeof(acc[0])); ++i) {
                const int n0 = tile_n0(i);
                if (n0 >= BV) continue;
                uint32_t bb[2];
                b_frag(bb, s * 8, n0);
                mma_tf32(acc[i], a, bb);
            }
        }
    }
    template <typename Acc, typename TileN0>
    __device__ __forceinline__ void qg_terms(Acc& acc,
                                             const float (&qf)[kSteps][4],
                                             const T* so,
                                             TileN0&& tile_n0) const {
        state_terms(acc, qf, tile_n0, [&](uint32_t(&bb)[2], int k, int n0) { frag_b16(bb, so, ld, k, n0, g, t); });
    }
    template <typename Acc, typename TileN0>
    __device__ __forceinline__ void w_terms(Acc& acc, const float (&wf)[kSteps][4], TileN0&& tile_n0) const {
        state_terms(
            acc, wf, tile_n0, [&](uint32_t(&bb)[2], int k, int n0) { frag_b_f(bb, sdvn_bits, ld, k, n0, g, t); });
    }

    // Load groups, oldest first: dO(n), KA(n); dO(n - 1) is issued as chunk n starts and KA(n - 1) after its step 1,
    // so each wait is for the group the chunk needs.
    __device__ __forceinline__ void start_loads(PhaseSums& ps) const {
        load_do(last);
        cp_async_commit();
        load_ka(last);
        cp_async_commit();
        ps.start();
    }
    // The top of chunk n: its dO, Kg, A and Gamma in shared memory; returns its dO tile.
    __device__ __forceinline__ const T* enter_chunk(int n, PhaseSums& ps) const {
        if (n > 0) load_do(n - 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        ps.add(1);
        return static_cast<const T*>(sdo(n));
    }

    // The chunk loop with dS in its owner warps' registers for the whole scan (fused_rscan; as the forward scan's S),
    // with a TF32 copy in sds that dvn_step reads as bits; Qg^T dO joins dvn_step's phase, so the dS update after
    // the barrier is W^T dVn alone. dhs gets dS as it enters each chunk, ds0 the final dS.
    __device__ __forceinline__ void scan_fused(const float* dst, float* ds0, float* dhs, PhaseSums& ps) const {
        float qf[kSteps][4], wf[kSteps][4];
        RegState<BV> sr(kd, warp, lane);
        sr.load(dst != nullptr ? dst + unit * kv + y0 : nullptr, vd);
        const int ldst = ld_row(kd), sds_lane = bt_x4_lane(ldst, b_pair_dn<kN>(), lane);
        sr.write_copy_t(sds, ldst);
        auto tile_n0 = [&](int i) { return sr.tile_n0(i); };
        const auto* sds_bits = reinterpret_cast<const uint32_t*>(sds);
        start_loads(ps);
        // dS as it enters each chunk, to dhs: the first here, the others at the end of the chunk before, where the
        // stores overlap the barrier (at the top of the chunk they stalled its loads of Qg and W).
        sr.store(dhs + chunk_index(d, unit, last) * kv + y0, vd);
        for (int n = last; n >= 0; --n) {
            const int64_t cb = chunk_index(d, unit, n);
            const bool more = n > 0;
            const T* so = enter_chunk(n, ps);
            load_qw(n, qf, wf);
            dvn_step(
                so, cb, [&](uint32_t(&bb)[2][2], int k, int n0) { frag_bt_x4(bb, sds_bits, sds_lane, ldst, k, n0); });
            if (sr.stl.on) {
                const float* gl = sg + (n & 1) * kd;
                sr.scale(expf(gl[sr.r0]), expf(gl[sr.r0 + 8]));
                qg_terms(sr.s, qf, so, tile_n0);
            }
            __syncthreads();
            ps.add(2);
            if (more) load_ka(n - 1);
            cp_async_commit();
            ps.add(3);
            if (sr.stl.on) {
                w_terms(sr.s, wf, tile_n0);
                // dS is now the gradient of the state entering chunk n, which is zero at a document start
                // (chunk_resets): nothing flows back into chunk n - 1 (dhs below) or ds0.
                if (chunk_resets(d, w, unit, n)) sr.clear();
                sr.write_copy_t(sds, ldst);  // no warp reads the copy in this phase
            }
            if (more) sr.store(dhs + chunk_index(d, unit, n - 1) * kv + y0, vd);
            __syncthreads();
            ps.add(4);
        }
        cp_async_wait<0>();
        if (ds0 != nullptr) sr.store(ds0 + unit * kv + y0, vd);
    }

    // The chunk loop with dS in fp32 shared memory (BV = 16 and 128): the dS update in two passes over the column
    // tiles at BV = 128, so that its accumulators and Qg, W's fragments fit in registers.
    __device__ __forceinline__ void scan_smem(const float* dst, float* ds0, float* dhs, PhaseSums& ps) const {
        constexpr int kN3 = BV / 8;
        float qf[kSteps][4], wf[kSteps][4];
        const int sr0 = stl.x0 + g;
        for (int e = tid; e < kd * BV; e += kThreads) {
            const int x = e / BV, y = e % BV;
            sds[x * ld + y] = dst != nullptr ? dst[unit * kv + static_cast<int64_t>(x) * vd + y0 + y] : 0.0f;
        }
        __syncthreads();  // the first store_state reads other threads' elements
        start_loads(ps);
        // dS as it enters each chunk, to dhs: issued before the wait for the chunk's loads (as the fused path does).
        for (int n = last; n >= 0; --n) {
            const int64_t cb = chunk_index(d, unit, n);
            const bool more = n > 0;
            store_state<BV>(dhs + cb * kv + y0, sds, kd, vd);
            const T* so = enter_chunk(n, ps);
            dvn_step(so, cb, [&](uint32_t(&bb)[2][2], int k, int n0) {
                b_pair_frags<kN>(
                    bb, k, n0, [&](uint32_t(&b1)[2], int kk, int nn) { frag_b(b1, sds, ld, kk, nn, g, t); });
            });
            load_qw(n, qf, wf);  // in flight across the barrier and the copy issue below
            __syncthreads();
            ps.add(2);
            if (more) load_ka(n - 1);
            cp_async_commit();
            ps.add(3);
            // Step 2: dS <- Diag(gamma) dS + Qg^T dO - W^T dVn, into the fp32 dS in shared memory, in two passes over
            // the column tiles at BV = 128 (the same sums per element), so that the accumulators and Qg, W's
            // fragments fit in registers.
            if (stl.on) {
                constexpr int kPasses = kN3 > 8 ? 2 : 1, kPer = kN3 / kPasses;
                const bool reset = chunk_resets(d, w, unit, n);  // as in scan_fused: dS entering a document is zero
                const float* gl = sg + (n & 1) * kd;
                const float e0 = expf(gl[sr0]), e1 = expf(gl[sr0 + 8]);
#pragma unroll 1
                for (int pass = 0; pass < kPasses; ++pass) {
                    auto tile_n0 = [&](int i) { return (stl.nt0 + stl.step * (pass * kPer + i)) * 8; };
                    float acc[kPer][4];
#pragma unroll
                    for (int i = 0; i < kPer; ++i) {
                        const int c0 = tile_n0(i) + 2 * t;
                        if (c0 >= BV) continue;
                        acc[i][0] = sds[sr0 * ld + c0] * e0;
                        acc[i][1] = sds[sr0 * ld + c0 + 1] * e0;
                        acc[i][2] = sds[(sr0 + 8) * ld + c0] * e1;
                        acc[i][3] = sds[(sr0 + 8) * ld + c0 + 1] * e1;
                    }
                    qg_terms(acc, qf, so, tile_n0);
                    w_terms(acc, wf, tile_n0);
#pragma unroll
                    for (int i = 0; i < kPer; ++i) {
                        const int c0 = tile_n0(i) + 2 * t;
                        if (c0 >= BV) continue;
                        if (reset) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
                        *reinterpret_cast<float2*>(sds + sr0 * ld + c0) = make_float2(acc[i][0], acc[i][1]);
                        *reinterpret_cast<float2*>(sds + (sr0 + 8) * ld + c0) = make_float2(acc[i][2], acc[i][3]);
                    }
                }
            }
            __syncthreads();
            ps.add(4);
        }
        cp_async_wait<0>();
        if (ds0 != nullptr) store_state<BV>(ds0 + unit * kv + y0, sds, kd, vd);
    }
};

// Reverse scan (kda.md §4.6 step 3; the phases are Rscan's members): dVn = A^T dO + Kg dS (stored), then
// dS <- Diag(gamma) dS + Qg^T dO - W^T dVn; dhs gets dS as it leaves each chunk, ds0 the final dS. In step 2 a warp's A
// operands are its own state rows' slices of Qg and W
// ([c, 16] each, no other warp reads them): they come from global memory straight into registers, instead of
// through shared memory, which leaves room for BV = 128 (one block per unit, one wave at 8 x 4096).
template <typename T, int BV, bool kModel>
__global__ void __launch_bounds__(kThreads, 1) rscan_tc_kernel(const T* __restrict__ dout,
                                                               const float* __restrict__ dst,
                                                               float* __restrict__ ds0,
                                                               Dims dims,
                                                               Work w,
                                                               float* dhs,
                                                               float* dvns,
                                                               PhaseSums ps) {
    extern __shared__ __align__(16) float smem[];
    const Rscan<T, BV, kModel> s(smem, dims, w, dout, dvns);
    if constexpr (fused_rscan(BV))
        s.scan_fused(dst, ds0, dhs, ps);
    else
        s.scan_smem(dst, ds0, dhs, ps);
    ps.flush(5);
}

template <typename T, int BV>
void rscan_bv(const T* dout, const float* dst, float* ds0, const Dims& d, const Work& w, float* dhs, float* dvn) {
    const dim3 grid(static_cast<unsigned>(d.v / BV), static_cast<unsigned>(d.units()));
    const size_t smem = static_cast<size_t>(rscan_tc_floats(d, BV)) * sizeof(float);
    // Phases: p1 wait for dO/Kg/A, p2 dVn (fused_rscan: and the loads of Qg, W and Qg^T dO), p3 load issue, p4 dS
    // update (fused_rscan: W^T dVn; else also the register loads of Qg, W).
    const PhaseLog phases("rscan", static_cast<int64_t>(grid.x) * grid.y);
    with_model_shape(d, [&](auto model) {
        const auto kernel = rscan_tc_kernel<T, BV, decltype(model)::value>;
        set_smem(kernel, smem);
        kernel<<<grid, kThreads, smem, core::exec_stream()>>>(dout, dst, ds0, d, w, dhs, dvn, {phases.clock().p});
    });
    phases.print(5);
}

}  // namespace

int rscan_tile(const Dims& d, int forced) {
    return pick_bv(d, forced, rscan_tc_floats);
}

void rscan_tc_launch(const Tensor& dout,
                     const Tensor& dst,
                     const Tensor& ds0,
                     const Dims& d,
                     const Work& w,
                     float* dhs,
                     float* dvn,
                     int bv) {
    const float* dstp = dst.defined() ? dst.data<float>() : nullptr;
    float* ds0p = ds0.defined() ? ds0.data<float>() : nullptr;
    MT_CUDA_DISPATCH(dout.dtype(), T, {
        const T* dp = static_cast<const T*>(dout.raw());
        if constexpr (std::is_same_v<T, float>) {
            MT_CHECK(false, "kda rscan_tc: f32 inputs take the fp32 scan");
        } else {
            with_bv(bv, [&](auto tile) { rscan_bv<T, decltype(tile)::value>(dp, dstp, ds0p, d, w, dhs, dvn); });
        }
    });
    MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::ops::cuda::kda
