// CUDA KDA backward (kda.md §4.6), first straightforward version, fp32 math. Kernels, in order:
//   prep + scan (kda.cu): recompute the chunk quantities, then the forward scan storing the state entering each
//         chunk (hs) and Vn.
//   rscan: one block per (16 value columns, unit), chunks last to first, dS columns in shared memory: stores dS (the
//         gradient of the state leaving the chunk), dVn = A^T dO + Kg dS, then dS <- Diag(gamma) dS + Qg^T dO - W^T
//         dVn; the last dS is dS_0.
//   chunk: one block per (chunk, unit), chunks in parallel (its phases: ChunkBwd, kda_bwd_chunk.cuh): dA, dQg, dKg, dW,
//   dXw = T^T dW, dXu = T^T dVn, dT,
//         dL = -strict_tril(T^T dT T^T), the elementwise factors, the pairwise intra-chunk terms (rows, then
//         columns: each output element has one writer), the reverse cumsum to dg; dv, dg, dbeta written; dq and dk
//         too when HV = H, else per value head into fp32 buffers for:
//   group (HV > H only): dq, dk = sum over the value heads of a GVA group, in head order.
// For bf16/f16 inputs (kda::use_tc) prep, the scans and most of chunk run on tensor cores instead: kda_prep_tc.cu,
// kda_scan_tc.cu, kda_chunk_tc.cu (products over V) and kda_intra_tc.cuh (products over T, intra-chunk terms).
// Deterministic: fixed loop orders, no atomics.
#include "ops/cuda/kda/kda_bwd_chunk.cuh"
#include "ops/cuda/kda/kda_common.cuh"
#include "ops/cuda/kda/kda_intra_tc.cuh"
#include "ops/cuda/kda/kda_mma.cuh"
#include "ops/kda.h"
#include "ops/registry.h"

namespace mt::ops::cuda {

namespace kda {

namespace {

// Per-chunk fp32 scratch of the chunk kernel: dqg, dkg, dw, dxw [C, K] (become dq, dk, -, dGamma), dxu [C, V].
struct Scratch {
    float *dqg, *dkg, *dw, *dxw, *dxu;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) rscan_kernel(const T* __restrict__ dout,
                                                         const float* __restrict__ dst,
                                                         float* __restrict__ ds0,
                                                         Dims d,
                                                         Work w,
                                                         float* dhs,
                                                         float* dvns) {
    extern __shared__ float smem[];
    float* ds = smem;                          // [kd, kBV]
    float* sdo = ds + d.k * kBV;               // [c, kBV]
    float* sdvn = sdo + kMaxChunk * kBV;       // [c, kBV]
    float* t1 = sdvn + kMaxChunk * kBV;        // [c, kd]: Kg, then Qg
    float* t2 = t1 + kMaxChunk * d.k;          // [c, kd]: W
    float* sa = t2 + kMaxChunk * d.k;          // [c, c] A
    float* sgam = sa + kMaxChunk * kMaxChunk;  // [kd] gamma
    const int unit = blockIdx.y, b = unit / d.hv, hv = unit % d.hv, y0 = blockIdx.x * kBV, tid = threadIdx.x;
    const int c = d.c, kd = d.k, vd = d.v, bv = min(kBV, vd - y0);
    const int64_t kv = static_cast<int64_t>(kd) * vd;
    for (int e = tid; e < kd * kBV; e += blockDim.x) {
        const int x = e / kBV, yl = e % kBV;
        ds[e] = (dst != nullptr && yl < bv) ? dst[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] : 0.0f;
    }
    __syncthreads();
    for (int n = d.nc - 1; n >= 0; --n) {
        const int64_t cb = chunk_index(d, unit, n);
        const float* gam = w.gam + ck_off(d, cb);
        for (int e = tid; e < kd * bv; e += blockDim.x) {
            const int x = e / bv, yl = e % bv;
            dhs[cb * kv + static_cast<int64_t>(x) * vd + y0 + yl] = ds[x * kBV + yl];
        }
        stage(t1, w.kg + ck_off(d, cb), c * kd);
        stage(t2, w.w + ck_off(d, cb), c * kd);
        stage(sa, w.a + cc_off(d, cb), c * c);
        for (int x = tid; x < kd; x += blockDim.x) sgam[x] = expf(gam[(c - 1) * kd + x]);
        for (int e = tid; e < c * kBV; e += blockDim.x) {
            const int i = e / kBV, yl = e % kBV, t = n * c + i;
            sdo[e] = ld(dout, v_row(d, b, t < d.t ? t : 0, hv) + y0 + yl, t < d.t && yl < bv);
        }
        __syncthreads();
        // dVn = A^T dO + Kg dS
        for (int e = tid; e < c * kBV; e += blockDim.x) {
            const int i = e / kBV, yl = e % kBV;
            if (yl >= bv) {
                sdvn[e] = 0.0f;
                continue;
            }
            float acc = 0.0f;
            for (int j = i; j < c; ++j) acc += sa[j * c + i] * sdo[j * kBV + yl];
            float acc2 = 0.0f;
            for (int x = 0; x < kd; ++x) acc2 += t1[i * kd + x] * ds[x * kBV + yl];
            const float dvn = acc + acc2;
            sdvn[e] = dvn;
            dvns[cv_off(d, cb) + static_cast<int64_t>(i) * vd + y0 + yl] = dvn;
        }
        __syncthreads();
        stage(t1, w.qg + ck_off(d, cb), c * kd);
        __syncthreads();
        // dS <- Diag(gamma) dS + Qg^T dO - W^T dVn, the gradient of the state entering chunk n: zero when that state
        // is (chunk_resets), so no gradient reaches chunk n - 1 or ds0.
        const bool reset = chunk_resets(d, w, unit, n);
        for (int e = tid; e < kd * kBV; e += blockDim.x) {
            const int x = e / kBV, yl = e % kBV;
            if (yl >= bv) continue;
            float acc = 0.0f, acc2 = 0.0f;
            for (int i = 0; i < c; ++i) {
                acc += t1[i * kd + x] * sdo[i * kBV + yl];
                acc2 += t2[i * kd + x] * sdvn[i * kBV + yl];
            }
            ds[e] = reset ? 0.0f : (ds[e] * sgam[x] + acc) - acc2;
        }
        __syncthreads();
    }
    if (ds0 != nullptr)
        for (int e = tid; e < kd * bv; e += blockDim.x) {
            const int x = e / bv, yl = e % bv;
            ds0[unit * kv + static_cast<int64_t>(x) * vd + y0 + yl] = ds[x * kBV + yl];
        }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) chunk_kernel(const T* __restrict__ q,
                                                         const T* __restrict__ k,
                                                         const T* __restrict__ v,
                                                         const T* __restrict__ beta,
                                                         const T* __restrict__ dout,
                                                         Dims d,
                                                         Work w,
                                                         const float* __restrict__ hs,
                                                         const float* __restrict__ vns,
                                                         const float* __restrict__ dvns,
                                                         const float* __restrict__ dhs,
                                                         Scratch sc,
                                                         const float* __restrict__ pre_da,
                                                         const float* __restrict__ pre_dgl,
                                                         float* __restrict__ dqh,
                                                         float* __restrict__ dkh,
                                                         T* __restrict__ dq,
                                                         T* __restrict__ dk,
                                                         T* __restrict__ dv,
                                                         T* __restrict__ dg,
                                                         T* __restrict__ dbeta,
                                                         bool tc,
                                                         const int* __restrict__ only,
                                                         bool fill_xw,
                                                         PhaseClock pc) {
    // With chunk_smem_kernel in front, only the chunks it left (only[cb] != 0) are done here.
    if (only != nullptr && only[chunk_index(d, blockIdx.y, blockIdx.x)] == 0) return;
    extern __shared__ float smem[];
    const ChunkBwd<T> s(smem, d, w, q, k, v, dout, hs, vns, dvns, dhs, sc.dqg, sc.dkg, sc.dw, sc.dxw, sc.dxu);
    pc.mark(0);
    s.stage_beta(beta, fill_xw);
    s.v_products(pre_da, pre_dgl);
    __syncthreads();
    pc.mark(1);
    s.t_products(tc);
    __syncthreads();
    pc.mark(2);
    s.dl(tc);
    __syncthreads();
    pc.mark(3);
    s.dm_dbeta();
    __syncthreads();
    pc.mark(4);
    s.dbeta_dgl();
    __syncthreads();
    pc.mark(5);
    s.elementwise(dv);
    __syncthreads();
    pc.mark(6);
    s.intra(tc);
    pc.mark(7);
    s.store(dq, dk, dg, dbeta, dqh, dkh);
    pc.mark(8);
}

// dq[b, t, h] = sum over the group's value heads hv = h * group + i, in order.
template <typename T>
__global__ void group_kernel(const float* __restrict__ dqh, const float* __restrict__ dkh, T* dq, T* dk, Dims d) {
    const int64_t total = static_cast<int64_t>(d.b) * d.t * d.h * d.k;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t x = e % d.k, bth = e / d.k, hh = bth % d.h, bt = bth / d.h;
        const int64_t src = (bt * d.hv + hh * d.group) * d.k + x;
        float aq = 0.0f, ak = 0.0f;
        for (int i = 0; i < d.group; ++i) {
            aq += dqh[src + i * d.k];
            ak += dkh[src + i * d.k];
        }
        dq[e] = from_f32<T>(aq);
        dk[e] = from_f32<T>(ak);
    }
}

}  // namespace

}  // namespace kda

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
             const ops::KdaOptions& options,
             const ops::KdaSaved* saved) {
    constexpr std::string_view op = "kda_bwd";
    kda_check_dtypes(q,
                     k,
                     v,
                     g,
                     beta,
                     {{"dout", dout}, {"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}, {"dbeta", dbeta}},
                     {{"s0", s0}, {"dst", dst}, {"ds0", ds0}},
                     options.chunk_size,
                     op);
    core::NvtxRange range("kda_bwd");
    kda::Profile prof("bwd");
    const kda::Dims d = kda_dims(q, v, options.chunk_size);
    const kda::Plan plan = kda::make_plan(d, q.dtype(), options.kernels);
    if (options.chosen != nullptr) *options.chosen = kda::plan_name(plan, true);
    const bool tc = plan.tc;
    // What the forward kept (ops::KdaSaved; it fills one only on this path): A, M, T, maybe hs and Vn, maybe Gamma,
    // Qg, Kg and W too. Read only: the buffers below that would overwrite them get their own memory instead.
    // bf16 states alone (save_states_bf16) are read only by chunk_mm_tc; a plan without it cannot use them.
    const bool tiles_in = saved != nullptr && saved->has_tiles() && tc;
    const bool states16_in = saved != nullptr && saved->has_bf16_states() && plan.chunk_tc;
    const bool states_in = (tiles_in && saved->has_states()) || states16_in;
    const bool ws_in = states_in && saved->has_workspace();  // kept only beside the tiles (check_saved)
    auto mut = [](const Tensor& t) { return const_cast<float*>(t.data<float>()); };
    kda::Work given{};
    if (tiles_in) {
        given.a = mut(saved->a);
        given.m = mut(saved->m);
        given.tm = mut(saved->t);
    }
    if (ws_in) {
        given.gam = mut(saved->gam);
        given.qg = mut(saved->qg);
        given.kg = mut(saved->kg);
        given.w = mut(saved->w);
    }
    std::vector<Tensor> keep;
    kda::Work w = kda::work_alloc(d, keep, false, given, !states_in);
    w.reset = options.chunk_reset.defined() ? options.chunk_reset.data<int32_t>() : nullptr;
    prof.mark("alloc");
    if (tc && !ws_in)
        kda::prep_tc_launch(q, k, v, g, beta, d, w, tiles_in ? kda::PrepMode::bwd_tiles : kda::PrepMode::bwd);
    else if (!tc)
        kda::prep_launch(q, k, v, g, beta, d, w);
    prof.mark("prep");
    const int64_t chunks = static_cast<int64_t>(d.units()) * d.nc;
    auto alloc = [&](int64_t n) {
        keep.push_back(Tensor::scratch({n}, DType::f32, core::Device::cuda));
        return keep.back().data<float>();
    };
    const int64_t kv = static_cast<int64_t>(d.k) * d.v, cv = static_cast<int64_t>(d.c) * d.v,
                  ck = static_cast<int64_t>(d.c) * d.k;
    kda::StatesIn states;
    if (states16_in)
        states = {
            nullptr, nullptr, static_cast<const bf16*>(saved->hs.raw()), static_cast<const bf16*>(saved->vn.raw())};
    else if (states_in)
        states = {saved->hs.data<float>(), saved->vn.data<float>(), nullptr, nullptr};
    float* dhs = alloc(chunks * kv);
    float* dvn = alloc(chunks * cv);
    if (!states_in) {
        float* hsw = alloc(chunks * kv);
        float* vnw = alloc(chunks * cv);
        if (tc)
            kda::scan_tc_launch(q.dtype(), s0, Tensor(), Tensor(), d, w, {hsw, vnw, nullptr, nullptr}, plan.scan_bv);
        else
            kda::scan_launch(s0, Tensor(), Tensor(), d, w, hsw, vnw);
        states = {hsw, vnw, nullptr, nullptr};
        prof.mark("scan");
    }
    const dim3 scan_grid(static_cast<unsigned>((d.v + kda::kBV - 1) / kda::kBV), static_cast<unsigned>(d.units()));
    const size_t rscan_smem = kda::rscan_smem_bytes(d);
    const float* dstp = dst.defined() ? dst.data<float>() : nullptr;
    float* ds0p = ds0.defined() ? ds0.data<float>() : nullptr;
    if (tc) {
        kda::rscan_tc_launch(dout, dst, ds0, d, w, dhs, dvn, plan.rscan_bv);
    } else {
        MT_CUDA_DISPATCH(q.dtype(), T, {
            MT_CUDA_CHECK(cudaFuncSetAttribute(
                kda::rscan_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(rscan_smem)));
            kda::rscan_kernel<T><<<scan_grid, kda::kThreads, rscan_smem, core::exec_stream()>>>(
                static_cast<const T*>(dout.raw()), dstp, ds0p, d, w, dhs, dvn);
        });
        MT_CUDA_CHECK(cudaGetLastError());
    }
    prof.mark("rscan");
    // W, U and A are read only by the scans: their workspace holds dXw, dXu and dA from here on (every entry is
    // written before it is read; A's zero tiles above the diagonal are the zeros dA needs there), which saves
    // allocating and zero-filling ~0.7 GB at 8 x 4096. A and U kept by the forward are not ours to overwrite: dA and
    // dXu get their own buffers then (dA's zero tiles are written by chunk_mm_tc, which covers every tile).
    if (tiles_in && plan.chunk_tc) w.a = alloc(chunks * d.c * d.c);  // chunk_mm_tc's dA
    const kda::Scratch sc{alloc(chunks * ck),
                          alloc(chunks * ck),
                          alloc(chunks * ck),
                          ws_in ? alloc(chunks * ck) : w.w,
                          w.u != nullptr ? w.u : alloc(chunks * cv)};
    float* pre_da = nullptr;
    float* pre_dgl = nullptr;
    if (plan.chunk_tc) {
        pre_da = w.a;
        pre_dgl = alloc(chunks * d.k);
        kda::chunk_mm_tc_launch(dout, d, w, states, dvn, dhs, sc.dqg, sc.dkg, sc.dw, pre_da, pre_dgl);
        prof.mark("chunk_mm");
    }
    const int64_t rows = static_cast<int64_t>(d.b) * d.t * d.hv * d.k;
    float* dqh = d.group == 1 ? nullptr : alloc(rows);
    float* dkh = d.group == 1 ? nullptr : alloc(rows);
    int* only = nullptr;
    if (plan.chunk_smem) {
        keep.push_back(Tensor::scratch({chunks}, DType::i32, core::Device::cuda));
        only = keep.back().data<int32_t>();
        kda::chunk_smem_launch(
            q, k, v, beta, d, w, dvn, sc.dqg, sc.dkg, sc.dw, pre_dgl, dqh, dkh, dq, dk, dv, dg, dbeta, only);
        prof.mark("chunk_smem");
    }
    const dim3 chunk_grid(static_cast<unsigned>(d.nc), static_cast<unsigned>(d.units()));
    const kda::PhaseLog phases("chunk", chunks);
    const size_t chunk_smem = (3 * static_cast<size_t>(d.c) * d.c + 2 * kda::kMaxChunk + d.k) * sizeof(float);
    MT_CUDA_DISPATCH(q.dtype(), T, {
        MT_CUDA_CHECK(cudaFuncSetAttribute(
            kda::chunk_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(chunk_smem)));
        kda::chunk_kernel<T><<<chunk_grid, kda::kThreads, chunk_smem, core::exec_stream()>>>(
            static_cast<const T*>(q.raw()),
            static_cast<const T*>(k.raw()),
            static_cast<const T*>(v.raw()),
            static_cast<const T*>(beta.raw()),
            static_cast<const T*>(dout.raw()),
            d,
            w,
            states.hs,  // null with bf16 states: then chunk_mm_tc did the products that read h and Vn
            states.vn,
            dvn,
            dhs,
            sc,
            pre_da,
            pre_dgl,
            dqh,
            dkh,
            static_cast<T*>(dq.raw()),
            static_cast<T*>(dk.raw()),
            static_cast<T*>(dv.raw()),
            static_cast<T*>(dg.raw()),
            static_cast<T*>(dbeta.raw()),
            tc,  // dT products and intra-chunk terms on tensor cores (3xTF32)
            only,
            ws_in,
            phases.clock());
    });
    MT_CUDA_CHECK(cudaGetLastError());
    prof.mark("chunk");
    phases.print(9);
    if (d.group == 1) return;
    const int64_t total = static_cast<int64_t>(d.b) * d.t * d.h * d.k;
    MT_CUDA_DISPATCH(q.dtype(), T, {
        kda::group_kernel<T><<<grid_for(total, 256), 256, 0, core::exec_stream()>>>(
            dqh, dkh, static_cast<T*>(dq.raw()), static_cast<T*>(dk.raw()), d);
    });
    MT_CUDA_CHECK(cudaGetLastError());
    prof.mark("group");
}
MT_REGISTER_KERNEL(kda_bwd, cuda, kda_bwd, ::mt::ops::half_and_float_dtypes);

}  // namespace mt::ops::cuda
